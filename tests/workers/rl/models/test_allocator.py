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
    from workers.rl.config import GRPOConfig
    from workers.rl.models.build import build_model
    from workers.rl.models.hf_tiny import make_tiny_hf_model

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                         "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    mapped = lambda: libc.mallinfo2().hblkhd  # bytes in blocks mapped on their own
    tmp = Path(sys.argv[1])
    config = GRPOConfig.resolve({"model": str(make_tiny_hf_model(tmp / "tiny")), "engine": "transformers",
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


HEAP_PAGES = textwrap.dedent("""
    import threading
    import torch
    from workers.rl.models.allocator import give_back_free_heap_pages, return_freed_tensors_to_the_os

    def anonymous_mb():
        line = next(l for l in open("/proc/self/status") if l.startswith("RssAnon:"))
        return int(line.split()[1]) / 1024

    assert return_freed_tensors_to_the_os()
    kept = []
    def fragment():  # 128 MiB of 64 KiB tensors in a thread's arena; one in eight kept, so no heap frees from its top
        blocks = [torch.ones(16 << 10) for _ in range(2048)]
        kept.extend(blocks[::8])
    thread = threading.Thread(target=fragment)
    thread.start()
    thread.join()
    before = anonymous_mb()
    assert give_back_free_heap_pages()
    assert before - anonymous_mb() > 64, f"{before:.0f} MB before, {anonymous_mb():.0f} MB after"
    # At most once every few seconds (a trim at every tiny step cost a fifth of it), unless told otherwise.
    assert not give_back_free_heap_pages() and give_back_free_heap_pages(at_most_every=0)
""")


def test_the_free_pages_inside_threads_heaps_go_back_to_the_os(tmp_path):
    root = Path(__file__).resolve().parents[4]
    done = subprocess.run([sys.executable, "-c", HEAP_PAGES], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
