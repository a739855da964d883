"""A root filesystem for the docker backend's `python-3.11` base, made from this machine's own files.

Nothing can be pulled here, so the base image is `docker import`ed from a tarball: the machine's python3.11,
its standard library and the shared libraries they link, /bin/sh and a few coreutils. Paths are kept as on
the machine (merged /usr), so the dynamic loader's cache carries over unchanged.
"""

import io
import subprocess
import tarfile
from pathlib import Path

PYTHON = Path("/usr/bin/python3.11")
STDLIB = Path("/usr/lib/python3.11")
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__"}
TOOLS = ["dash", "cat", "ls", "echo", "tr", "seq", "mkdir", "rm", "cp", "mv", "env", "sleep", "head", "tail",
         "wc", "true", "false", "sort", "grep"]
ETC = {"passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/sandbox:/bin/sh\n",
       "group": "root:x:0:\nnogroup:x:65534:\n"}


def _linked_libraries(binaries: list[Path]) -> set[Path]:
    libraries = set()
    for chunk in range(0, len(binaries), 200):
        out = subprocess.run(["ldd", *map(str, binaries[chunk:chunk + 200])], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            for part in parts:
                if part.startswith("/") and Path(part).exists():
                    libraries.add(Path(part))
    return libraries


def _merged_usr(path: Path) -> str:
    """/lib/x.so -> usr/lib/x.so: the image has /lib, /lib64, /bin as links into /usr, as Debian does."""
    text = str(path)
    for top in ("/lib/", "/lib64/", "/bin/", "/sbin/"):
        if text.startswith(top):
            return "usr" + text
    return text.lstrip("/")


def build_python_rootfs(destination: Path) -> Path:
    binaries = [PYTHON] + [Path("/usr/bin") / tool for tool in TOOLS if (Path("/usr/bin") / tool).exists()]
    extensions = sorted((STDLIB / "lib-dynload").glob("*.so"))
    libraries = _linked_libraries(binaries + extensions)
    with tarfile.open(destination, "w") as tar:
        for link, target in [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")]:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for folder in ["tmp", "sandbox", "image", "etc", "proc", "dev", "sys"]:
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        arcnames = {_merged_usr(path): path for path in sorted({*binaries, *libraries, *extensions})}
        for arcname, path in sorted(arcnames.items()):  # /lib/x and /usr/lib/x are one file in the image
            tar.add(path.resolve(), arcname=arcname)
        for path in sorted(STDLIB.rglob("*")):
            relative = path.relative_to(STDLIB)
            if STDLIB_SKIP & set(relative.parts) or path.is_dir() or path.suffix in (".pyc", ".so"):
                continue
            tar.add(path, arcname=str(path).lstrip("/"), recursive=False)
        for alias, target in [("usr/bin/python3", "python3.11"), ("usr/bin/sh", "dash")]:
            info = tarfile.TarInfo(alias)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name, text in {**ETC, "ld.so.cache": None}.items():
            if text is None:
                tar.add("/etc/ld.so.cache", arcname="etc/ld.so.cache")
                continue
            data = text.encode()
            info = tarfile.TarInfo(f"etc/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return destination
