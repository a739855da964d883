"""Sandbox helpers shared by the test folders that run real sandboxes (tests/sandbox, tests/verifiers)."""

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from workers.sandbox.layers import LayerCache


def bubblewrap_skip_reason() -> str | None:
    if shutil.which("bwrap") is None:
        return "needs bubblewrap (make setup installs it as root: apt-get install bubblewrap)"
    probe = subprocess.run(["bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/usr", "/usr", "--symlink",
                            "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib", "/usr/bin/true"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"bubblewrap cannot create namespaces here: {probe.stderr.strip()}"


def skip_without_bubblewrap(items, folder: str) -> None:
    reason = bubblewrap_skip_reason()
    if reason:
        for item in items:
            if folder in str(item.fspath):
                item.add_marker(pytest.mark.skip(reason=reason))


def reachable_cache() -> LayerCache:
    """A layer cache the sandbox uids can reach (pytest's tmp_path is private to root)."""
    return LayerCache(Path(tempfile.mkdtemp(prefix="studio-layers-", dir="/var/tmp")))


def remove_cache(cache: LayerCache) -> None:
    shutil.rmtree(cache.root, ignore_errors=True)
