"""What goes into a sandbox and what comes out. Plain dataclasses: no Django, no backend details."""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, field
from enum import StrEnum

from workers.definitions.canonical import layer_chain_hashes


class Status(StrEnum):
    OK = "ok"  # exited 0
    ERROR = "error"  # exited non-zero, or crashed on its own (segfault, abort)
    TIMEOUT = "timeout"  # wall-clock or CPU-time limit
    KILLED = "killed"  # stopped for another limit (memory, output, files) or killed from outside, its sandbox included
    INFRA_ERROR = "infra_error"  # the sandbox could not run the program: retried, never scored


@dataclass(frozen=True)
class Limits:
    cpus: float = 1  # share of CPU cores while running (a cgroup quota where the backend has one)
    cpu_seconds: float = 30
    wall_seconds: float = 60
    memory_mb: int = 512
    max_processes: int = 64
    disk_mb: int = 256  # the sandbox's writable space (its working directory and /tmp)
    max_file_mb: int = 64
    open_files: int = 256
    output_bytes: int = 64 * 1024  # stdout and stderr are each kept up to this, with a truncation flag
    output_hard_bytes: int = 16 * 1024 * 1024  # past this much output the program is killed
    network: bool = False

    @classmethod
    def from_spec(cls, limits: dict) -> Limits:
        return cls(cpus=limits["cpus"], cpu_seconds=limits["cpu_seconds"], wall_seconds=limits["wall_seconds"],
                   memory_mb=limits["memory_mb"], max_processes=limits["max_processes"],
                   disk_mb=limits["disk_mb"], network=limits["network"])


@dataclass(frozen=True)
class SandboxImage:
    """A sandbox-image version as the engine sees it: the layers in order, the limits and the pool size.

    `key` identifies the exact version ("sandbox_image/python-3-11@2"); pools are keyed by it.
    """

    key: str
    layers: tuple[dict, ...]
    limits: Limits = Limits()
    warm_pool_size: int = 2

    @classmethod
    def from_spec(cls, key: str, spec: dict) -> SandboxImage:
        return cls(key=key, layers=tuple(spec["layers"]), limits=Limits.from_spec(spec["limits"]),
                   warm_pool_size=spec["warm_pool_size"])

    def to_json(self) -> dict:
        return {"key": self.key, "layers": list(self.layers), "limits": asdict(self.limits),
                "warm_pool_size": self.warm_pool_size}

    @classmethod
    def from_json(cls, data: dict) -> SandboxImage:
        return cls(key=data["key"], layers=tuple(data["layers"]), limits=Limits(**data["limits"]),
                   warm_pool_size=data["warm_pool_size"])

    @property
    def layer_hashes(self) -> list[str]:
        return layer_chain_hashes(list(self.layers))

    @property
    def python_modules(self) -> list[str]:
        """Top-level modules to import before a sandbox counts as warm (best effort: names of the pinned
        packages, e.g. numpy==2.1.3 -> numpy)."""
        names = []
        for layer in self.layers:
            if layer["type"] == "python_packages":
                for requirement in layer["packages"]:
                    names.append(requirement.split("==")[0].split("[")[0].replace("-", "_").lower())
        return names


DEFAULT_IMAGE = SandboxImage(key="builtin/python", layers=({"type": "base", "image": "python-3.11"},))


@dataclass
class Execution:
    """One program to run. `program` is Python source run as `main.py` in the warm interpreter; `command`
    is an argv to exec instead; `shell` a script for bash (sh where the image has no bash), whose final working
    directory comes back in the result's `cwd`. Files are written into the working directory first."""

    program: str | None = None
    command: list[str] | None = None
    shell: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    stdin: bytes = b""
    collect: list[str] = field(default_factory=list)  # output files to bring back (relative paths)
    limits: Limits | None = None  # defaults to the image's limits
    cwd: str = ""  # where it starts, relative to the working directory (a session's `cd` carried over)
    env: dict[str, str] = field(default_factory=dict)  # added to the sandbox's clean environment
    keep_background: bool = False  # processes it leaves running survive it (a session that says so)
    prefork: bool = False  # another run follows in this sandbox (a session): fork its process once this one is done

    def __post_init__(self):
        if sum(part is not None for part in (self.program, self.command, self.shell)) != 1:
            raise ValueError("give exactly one of program (Python source), command (argv) or shell (a script)")
        for name, value in self.env.items():
            if not isinstance(name, str) or not isinstance(value, str) or not name or "=" in name \
                    or "\0" in name + value:
                raise ValueError(f"environment variable {name!r}: names and values are strings, names without '='")


@dataclass
class ExecutionResult:
    status: Status
    exit_code: int | None = None
    signal: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_memory_mb: float = 0.0
    files: dict[str, bytes] = field(default_factory=dict)
    missing_files: list[str] = field(default_factory=list)
    reason: str = ""  # why it ended that way, in words
    isolation: list[str] = field(default_factory=list)  # what was actually applied
    backend: str = ""
    sandbox_id: str = ""
    attempts: int = 1
    cwd: str = ""  # a shell script's final working directory, relative to the working directory ("" if unknown)

    def to_json(self) -> dict:
        """JSON-safe whatever the program printed: output that is not UTF-8 comes back as base64, and says so
        in `stdout_encoding` / `stderr_encoding`; files are always base64."""
        data = asdict(self)
        data["status"] = str(self.status)
        for stream in ("stdout", "stderr"):
            raw = getattr(self, stream)
            try:
                data[stream], data[f"{stream}_encoding"] = raw.decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                data[stream], data[f"{stream}_encoding"] = base64.b64encode(raw).decode(), "base64"
        data["files"] = {name: base64.b64encode(content).decode() for name, content in self.files.items()}
        return data


class LeaseExpired(Exception):
    """The lease was reclaimed: it sat idle past its timeout or a session's lifetime, or its sandbox died."""


class NetworkRefused(Exception):
    """The image asks for the network (limits.network) and the backend was not allowed to give it any."""


def refuse_network(image: SandboxImage, *, allowed: bool) -> None:
    """Raises NetworkRefused when `image` asks for the network and the operator did not allow it. A sandbox with
    the network shares the host's (bubblewrap's --share-net, Docker's host mode): model-written code would reach
    the host's loopback services (the database, Redis) and the cloud's metadata address."""
    if image.limits.network and not allowed:
        raise NetworkRefused(f"{image.key} asks for the network (limits.network: true), which sandboxes in this "
                             "studio do not get: model-written code would reach the host's own services. Publish "
                             "the image without it, or have the operator allow it (STUDIO_SANDBOX_NETWORK=1)")
