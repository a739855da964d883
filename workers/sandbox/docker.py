"""The `docker` backend: images built layer by layer from the SandboxImage spec, containers kept warm.

- The `python-3.11` base is `docker import`ed from a root filesystem made of this machine's files (rootfs.py),
  since nothing can be pulled. Each further layer is one `docker build` step `FROM` the layer before, tagged
  `posttrain/layer:<chain hash>`: the tag is the build cache, so changing layer k rebuilds k and after only.
- A container runs the same zygote as the process backend, as uid 65534 with no capabilities, no network,
  a read-only root, tmpfs working space, and the engine's cgroup limits (memory without swap, pids, CPUs).
  The host talks to it over a unix socket in a per-container control directory.
- Destroying a container removes it with force: the engine kills every process in it.
"""

import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path

from .cgroups import oom_kill_count, process_alive
from .layers import SUPPORTED_BASES, LayerBuildError, install_python_packages, place_workspace_source, write_files
from .process import ZYGOTE_SOURCE
from .protocol import Channel
from .rootfs import build_python_rootfs
from .types import SandboxImage, refuse_network
from .zygote_client import START_TIMEOUT, SandboxError, ZygoteSandbox

BASE_TAG = "posttrain/base:python-3.11"
LAYER_REPOSITORY = "posttrain/layer"
DEFAULT_CONTROL_ROOT = Path("/var/tmp/posttrain-studio/docker")  # settings.SANDBOX_DOCKER_CONTROL names another
SANDBOX_USER = 65534
CGROUP_MEMORY = Path("/sys/fs/cgroup/memory/docker")
LABEL = "posttrain.sandbox.owner"  # the pid of the process whose pool started the container
REMOVE_TIMEOUT = 30.0  # seconds a destroy waits for the engine to have removed a container


class DockerBackend:
    name = "docker"

    API_CONNECTIONS = 4  # sockets to the engine this backend may hold open at once

    def __init__(self, client=None, *, control_root: Path = DEFAULT_CONTROL_ROOT, network_allowed: bool = False):
        import docker  # the SDK is only needed where this backend is used
        from urllib3._collections import RecentlyUsedContainer

        self.client = client or docker.from_env(max_pool_size=self.API_CONNECTIONS)
        # docker-py 7.2 keys its unix-socket connection pools by full URL and ignores num_pools (an operator-
        # precedence slip), so every container's URLs open sockets that stay until 25 pools exist. Keeping one
        # pool (the newest URL's) bounds the engine sockets at API_CONNECTIONS.
        adapter = self.client.api.adapters.get("http+docker://")
        if adapter is not None and hasattr(adapter, "pools"):
            adapter.pools = RecentlyUsedContainer(1, dispose_func=lambda pool: pool.close())
        self.control_root = Path(control_root)  # per container: the socket its zygote answers on
        self.builds = 0  # layers built (not found as tags) by this instance; the tests read it
        self.network_allowed = network_allowed  # limits.network: the host's network, the operator's choice only
        self.reap_orphans()

    def reap_orphans(self, *, older_than: float = 60.0) -> None:
        """What a studio process killed outright left: its containers (labelled with its pid; they remove
        themselves once their zygote sees the socket close, this is for the rest) and its control directories
        (named after their containers; one younger than `older_than` s may be another process's start under way)."""
        # The low-level listing: the high-level one inspects each container, and one removing itself is gone by then.
        for container in self.client.api.containers(all=True, filters={"label": LABEL}):
            owner = container["Labels"].get(LABEL, "")
            if owner.isdigit() and not process_alive(int(owner)):
                try:
                    self.client.api.remove_container(container["Id"], force=True)
                except Exception:
                    pass  # removing itself already
        if not self.control_root.is_dir():
            return
        names = {name.lstrip("/") for c in self.client.api.containers(all=True, filters={"label": LABEL})
                 for name in c["Names"]}
        for entry in self.control_root.iterdir():
            if entry.name not in names and time.time() - entry.stat().st_mtime > older_than:
                shutil.rmtree(entry, ignore_errors=True)

    def start(self, image: SandboxImage) -> "DockerSandbox":
        refuse_network(image, allowed=self.network_allowed)
        return DockerSandbox(self.client, image, tag=self.image_tag(image), control_root=self.control_root)

    def image_tag(self, image: SandboxImage) -> str:
        """The tag of the image's last layer, building whatever is missing."""
        import docker

        parent = None
        for layer, chain_hash in zip(image.layers, image.layer_hashes, strict=True):
            tag = f"{LAYER_REPOSITORY}:{chain_hash[:48]}"
            try:
                self.client.images.get(tag)
            except docker.errors.ImageNotFound:
                self._build(layer, parent, tag)
                self.builds += 1
            parent = tag
        return parent

    def _build(self, layer: dict, parent: str | None, tag: str) -> None:
        if layer["type"] == "base":
            if not layer["image"].startswith(SUPPORTED_BASES):
                raise LayerBuildError(f"base {layer['image']!r}: the docker backend can build "
                                      f"{', '.join(SUPPORTED_BASES)}* from this machine's files (nothing is pulled)")
            self._ensure_base()
            self.client.images.get(BASE_TAG).tag(*tag.split(":"))
            return
        with tempfile.TemporaryDirectory(prefix="posttrain-build-") as context:
            instructions = getattr(self, f"_layer_{layer['type']}")(layer, Path(context))
            (Path(context) / "Dockerfile").write_text(f"FROM {parent}\n" + "\n".join(instructions) + "\n")
            try:
                self.client.images.build(path=context, tag=tag, network_mode="none", rm=True, forcerm=True)
            except Exception as exc:
                raise LayerBuildError(f"docker could not build the {layer['type']} layer: {exc}") from exc

    def _ensure_base(self) -> None:
        import docker

        try:
            self.client.images.get(BASE_TAG)
        except docker.errors.ImageNotFound:
            with tempfile.TemporaryDirectory(prefix="posttrain-rootfs-") as folder:
                tarball = build_python_rootfs(Path(folder) / "rootfs.tar")
                repository, tag = BASE_TAG.split(":")
                with open(tarball, "rb") as handle:
                    self.client.api.import_image_from_data(handle.read(), repository=repository, tag=tag)

    def _layer_system_packages(self, layer: dict, context: Path) -> list[str]:
        raise LayerBuildError("the imported python-3.11 base has no package manager; system packages need a base "
                              "image that carries them")

    def _layer_python_packages(self, layer: dict, context: Path) -> list[str]:
        install_python_packages(layer["packages"], context / "site")  # builds have no network: copied in
        return ["COPY site/ /image/site/"]

    def _layer_files(self, layer: dict, context: Path) -> list[str]:
        write_files(layer["files"], context / "files")
        return ["COPY files/ /image/files/"]

    def _layer_workspace(self, layer: dict, context: Path) -> list[str]:
        """A session's prepared workspace: the files so far and the source, the prepare commands run where sessions
        see them (/sandbox), the result kept as the image's files (each sandbox's reset copies them in). The
        imported base has no bash: prepare commands and a session's shell commands run under its /bin/sh."""
        place_workspace_source(layer, context / "workspace")
        (context / "workspace").mkdir(exist_ok=True)
        (context / "prepare.sh").write_text("\n".join(["set -eu", *layer["prepare"]]) + "\n")
        return ["COPY prepare.sh /image/prepare.sh",
                "RUN mkdir -p /image/files && cp -a /image/files/. /sandbox/",
                "COPY workspace/ /sandbox/",
                # The image's /sandbox keeps a copy too; a container never sees it (its /sandbox is a tmpfs).
                "RUN cd /sandbox && HOME=/sandbox PYTHONPATH=/image/site /bin/sh /image/prepare.sh"
                " && rm -rf /image/files && mkdir /image/files && cp -a /sandbox/. /image/files/"]

    def _layer_setup_script(self, layer: dict, context: Path) -> list[str]:
        (context / "setup.sh").write_text(layer["script"])
        return ["COPY setup.sh /image/setup.sh",
                "RUN mkdir -p /image/files && cd /image/files && PYTHONPATH=/image/site /bin/sh -e /image/setup.sh"]


class DockerSandbox(ZygoteSandbox):
    backend_name = "docker"
    memory_limited = True

    def __init__(self, client, image: SandboxImage, *, tag: str, control_root: Path):
        from docker.types import Ulimit

        started = time.monotonic()
        self.image, self.id = image, f"dock-{uuid.uuid4().hex[:10]}"
        limits = image.limits
        self.control = control_root / self.id
        self.control.mkdir(parents=True, mode=0o700)
        os.chown(self.control, SANDBOX_USER, SANDBOX_USER)
        os.chmod(control_root, 0o711)
        disk = f"size={limits.disk_mb}m,uid={SANDBOX_USER},gid={SANDBOX_USER},mode=0700"
        self.isolation = ["docker", f"uid:{SANDBOX_USER}", "caps:none", "no-new-privileges", "fs:read-only-root",
                          "cgroup:memory,pids,cpu"] + ([] if limits.network else ["network:none"])
        try:
            self.container = client.containers.run(
                tag, ["/usr/bin/python3", "-s", "-B", "-c", ZYGOTE_SOURCE, json.dumps(image.python_modules)],
                detach=True, init=True, user=f"{SANDBOX_USER}:{SANDBOX_USER}", working_dir="/sandbox",
                network_mode="host" if limits.network else "none", read_only=True, cap_drop=["ALL"],
                security_opt=["no-new-privileges"], hostname="sandbox",
                environment={"PATH": "/usr/bin:/bin", "HOME": "/sandbox", "LANG": "C.UTF-8",
                             "PYTHONPATH": "/image/site", "PYTHONDONTWRITEBYTECODE": "1",
                             "ZYGOTE_SOCKET": "/control/zygote.sock"},
                tmpfs={"/sandbox": disk, "/tmp": disk}, shm_size=f"{limits.disk_mb}m",
                mem_limit=f"{limits.memory_mb + 64}m", memswap_limit=f"{limits.memory_mb + 64}m",
                pids_limit=limits.max_processes + 4, nano_cpus=int(max(limits.cpus, 0.1) * 1e9),
                ulimits=[Ulimit(name="nofile", soft=limits.open_files, hard=limits.open_files)],
                volumes={str(self.control): {"bind": "/control", "mode": "rw"}},
                labels={LABEL: str(os.getpid())}, name=self.id,
                # A container whose zygote is gone (its studio process was killed: the socket closed) removes
                # itself; destroy() removes the others.
                auto_remove=True,
            )
        except Exception as exc:
            shutil.rmtree(self.control, ignore_errors=True)
            raise SandboxError(f"docker could not start a container of {tag}: {exc}") from exc
        self.socket = self._connect(started + START_TIMEOUT)
        self.channel = Channel(self.socket.fileno(), self.socket.fileno())
        self._expect("ready", START_TIMEOUT, "start")
        self.assembly_seconds = time.monotonic() - started

    def _connect(self, deadline: float) -> socket.socket:
        path = self.control / "zygote.sock"
        while time.monotonic() < deadline:
            if path.exists():
                connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    connection.connect(str(path))
                    return connection
                except OSError:
                    connection.close()
            time.sleep(0.005)
        self.destroy()
        raise SandboxError("the container's zygote never opened its socket")

    @property
    def alive(self) -> bool:
        # A closed socket reads as empty without blocking; a live, idle zygote has nothing to read.
        try:
            return self.socket.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def oom_kills(self) -> int:
        return oom_kill_count(CGROUP_MEMORY / self.container.id)

    def destroy(self) -> None:
        """Remove the container and return once the engine no longer has it. A container whose zygote a program
        killed is removing itself already (auto_remove): the engine refuses a second removal while that one runs
        (409), so wait for it rather than return while the container is still listed."""
        import docker

        deadline = time.monotonic() + REMOVE_TIMEOUT
        while True:
            try:
                self.container.remove(force=True)
                break
            except docker.errors.NotFound:
                break
            except Exception:  # a removal in progress, or the engine slow to answer: ask again until it is gone
                if time.monotonic() > deadline:
                    break  # reap_orphans removes what is left once this process is gone
                time.sleep(0.1)
        if getattr(self, "socket", None) is not None:
            self.socket.close()
        shutil.rmtree(self.control, ignore_errors=True)
