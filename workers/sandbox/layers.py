"""The layer cache of the process backend: an image's layers built once per layer chain, not per sandbox.

Layer k of an image is cached under the chain hash of layers 0..k (workers.definitions.canonical.layer_chain_hashes),
so changing layer k rebuilds k and the layers after it and reuses 0..k-1. A layer's directory holds `site/`
(Python packages, on the sandbox's PYTHONPATH) and `files/` (copied into each sandbox's working directory).
Builds go to a temporary directory renamed into place, so concurrent builders never see half a layer.
"""

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .types import SandboxImage

DEFAULT_ROOT = Path("/var/tmp/posttrain-studio/layers")  # settings.SANDBOX_LAYER_CACHE names another
SUPPORTED_BASES = ("python-3.11",)  # what the process backend can offer: the machine's own python3.11


class LayerBuildError(Exception):
    """An image this backend cannot build, with the reason in words."""


def install_python_packages(packages: list[str], target: Path) -> None:
    """pip on this machine into `target` (same CPython ABI and glibc as the sandboxes, which have no network)."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-compile", "--target", str(target), *packages],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise LayerBuildError(f"pip could not install {' '.join(packages)}: {done.stderr[-2000:]}")


def write_files(files: dict[str, str], folder: Path) -> None:
    for relative, content in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def place_workspace_source(layer: dict, target: Path) -> None:
    """A session's workspace source (session.WorkspaceSource: a directory, or a tar archive unpacked with the
    standard library's `data` filter, which refuses absolute paths, `..`, devices and links out of the tree) into
    `target`."""
    if not layer["source"]:
        return
    source = Path(layer["source"])
    target.mkdir(parents=True, exist_ok=True)
    try:
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True, symlinks=True)
        else:
            with tarfile.open(source) as archive:
                archive.extractall(target, filter="data")
    except (OSError, tarfile.TarError) as exc:
        raise LayerBuildError(f"the workspace source {source} could not be copied: {exc}") from exc


class LayerCache:
    def __init__(self, root: Path = DEFAULT_ROOT):
        self.root = root
        self.builds = 0  # layers built (not found in the cache) by this instance; the tests read it

    def materialize(self, image: SandboxImage) -> Path:
        """The directory of the image's last layer, building whatever is missing."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        closed = [str(p) for p in [self.root, *self.root.parents] if not os.stat(p).st_mode & 0o001]
        if closed:
            raise LayerBuildError(f"the layer cache {self.root} is out of the sandboxes' reach: {closed[0]} is not "
                                  "searchable by other users (set STUDIO_SANDBOX_CACHE to a directory under /var/tmp)")
        previous: Path | None = None
        for layer, chain_hash in zip(image.layers, image.layer_hashes, strict=True):
            target = self.root / chain_hash
            if not target.exists():
                self._build(layer, previous, target)
            previous = target
        return previous

    def _build(self, layer: dict, previous: Path | None, target: Path) -> None:
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=self.root))
        try:
            if previous is not None:
                shutil.copytree(previous, work, dirs_exist_ok=True, copy_function=os.link, symlinks=True)
            for part in ("site", "files"):
                (work / part).mkdir(exist_ok=True)
            getattr(self, f"_apply_{layer['type']}")(layer, work)
            for path in [work, *work.rglob("*")]:
                if not path.is_symlink():
                    path.chmod(0o755 if path.is_dir() else (path.stat().st_mode | 0o444))
            try:
                work.rename(target)
                self.builds += 1
            except OSError:
                if not target.exists():
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _apply_base(self, layer: dict, work: Path) -> None:
        if not layer["image"].startswith(SUPPORTED_BASES):
            raise LayerBuildError(f"base {layer['image']!r}: the process backend runs this machine's Python 3.11 "
                                  f"({', '.join(SUPPORTED_BASES)}*); use the docker backend for other bases")

    def _apply_system_packages(self, layer: dict, work: Path) -> None:
        names = [p.split("=")[0] for p in layer["packages"]]
        missing = [n for n in names if subprocess.run(["dpkg-query", "-W", "-f=${Status}", n], capture_output=True,
                                                      text=True).stdout.strip() != "install ok installed"]
        if missing:
            raise LayerBuildError(f"system packages {', '.join(missing)} are not installed on this machine; the "
                                  "process backend shares the machine's /usr (install them, or use docker)")

    def _apply_python_packages(self, layer: dict, work: Path) -> None:
        install_python_packages(layer["packages"], work / "site")

    def _apply_files(self, layer: dict, work: Path) -> None:
        write_files(layer["files"], work / "files")

    def _apply_workspace(self, layer: dict, work: Path) -> None:
        """A session's prepared workspace: the files so far, the source on top, then the prepare commands run in it
        where sessions see it (/sandbox, so paths that installs record stay right), without network."""
        files, linked = work / "files", work / "files.linked"
        # The copy of the layer before is hard links: a command that writes a file in place would change that
        # layer too, so the workspace gets files of its own.
        files.rename(linked)
        shutil.copytree(linked, files, symlinks=True)
        shutil.rmtree(linked)
        place_workspace_source(layer, files)
        if not layer["prepare"]:
            return
        script = "\n".join(layer["prepare"])
        done = subprocess.run(["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
                               "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
                               "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
                               "--tmpfs", "/tmp", "--ro-bind", str(work), "/image", "--bind", str(files), "/sandbox",
                               "--chdir", "/sandbox", "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
                               "--setenv", "HOME", "/sandbox", "--setenv", "LANG", "C.UTF-8",
                               "--setenv", "PYTHONPATH", "/image/site", "/bin/bash", "-euc", script],
                              capture_output=True, text=True, timeout=1800, env={"PATH": "/usr/bin:/bin"})
        if done.returncode != 0:
            raise LayerBuildError(f"the session's prepare commands failed with status {done.returncode}: "
                                  f"{(done.stdout + done.stderr)[-2000:]}")

    def _apply_setup_script(self, layer: dict, work: Path) -> None:
        # Image authors write setup scripts, not the model; it still runs without network, as nobody.
        done = subprocess.run(["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
                               "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
                               "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
                               "--tmpfs", "/tmp", "--bind", str(work), "/image", "--chdir", "/image/files",
                               "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/image/files",
                               "--setenv", "PYTHONPATH", "/image/site", "/bin/bash", "-euc", layer["script"]],
                              capture_output=True, text=True, timeout=1800, env={"PATH": "/usr/bin:/bin"})
        if done.returncode != 0:
            raise LayerBuildError(f"setup script failed with status {done.returncode}: {done.stderr[-2000:]}")
