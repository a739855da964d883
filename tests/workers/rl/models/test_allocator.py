"""A process that builds a model gives the tensors it frees back to the operating system: glibc keeps every block
of a megabyte or more in a mapping of its own, however large a block freed before it was (its own rule raises the
threshold to the largest freed block, after which such tensors stay in the process's heaps when freed).

The check runs in a process of its own, as a worker is one: in the test session's process, blocks earlier tests
freed into the heap before any model was built can serve a later request, which says nothing about a worker."""

import ctypes
import ctypes.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHECK = textwrap.dedent("""
    import ctypes, ctypes.util, sys
    from pathlib import Path
    import torch
    from workers.rl.config import RunConfig
    from workers.rl.models.build import build_model
    from workers.rl.models.hf_tiny import make_tiny_hf_model

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                         "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    mapped = lambda: libc.mallinfo2().hblkhd  # bytes in blocks mapped on their own
    tmp = Path(sys.argv[1])
    config = RunConfig.resolve({"model": str(make_tiny_hf_model(tmp / "tiny")), "engine": "transformers",
                                "device": "cpu"})
    model = build_model(config, None, models_dir=tmp, pretrain_seconds=0)
    try:
        for megabytes in (16, 8, 4, 2):  # each smaller than the block freed before it
            before = mapped()
            block = torch.empty(megabytes << 20, dtype=torch.uint8)
            assert mapped() - before >= megabytes << 20, f"a {megabytes} MiB tensor came from the heap"
            del block
            assert mapped() <= before, f"a freed {megabytes} MiB tensor stayed mapped"
    finally:
        model.close()
""")


def test_tensors_freed_after_a_model_is_built_leave_the_process(tmp_path):
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("needs glibc 2.33 or later (mallinfo2)")
    root = Path(__file__).resolve().parents[4]
    done = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path)], cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
