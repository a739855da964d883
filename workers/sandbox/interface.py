"""The seam every sandbox backend fits: what SandboxPool needs from a backend and from one sandbox.

`process` (bubblewrap) and `docker` implement it; a cluster backend (Kubernetes pods) would too — see
CLUSTER.md for how pods, images and limits map onto it. Nothing here runs anything.
"""

from typing import Protocol

from .types import Execution, ExecutionResult, SandboxImage


class Sandbox(Protocol):
    id: str
    image: SandboxImage
    isolation: list[str]  # what was actually applied, reported in every result
    assembly_seconds: float  # from start() being called to ready

    @property
    def alive(self) -> bool:
        """Cheap and local: no round trip to the sandbox (the pool asks on every acquire)."""

    def run(self, execution: Execution) -> ExecutionResult:
        """Runs one program to completion, enforcing the limits from outside too. Never raises for anything the
        program does; a sandbox that dies during the run is the program's doing (status `killed`)."""

    def call(self, message: dict, timeout: float = 30.0) -> dict:
        """A session's request other than a run ({"op": "read_file" | "write_file" | "diff", ...}, see
        zygote.py's SESSION_OPS): the sandbox's answer, or the OSError / ValueError it reported for the caller's
        path; SandboxError when it does not answer (it is then destroyed)."""

    def reset(self) -> None:
        """Back to the image's clean state, or raise SandboxError (the pool then destroys it)."""

    def ping(self, timeout: float = 2.0) -> bool:
        """The heartbeat of an idle sandbox."""

    def destroy(self) -> None:
        """Every process of the sandbox gone, its resources released; safe to call twice."""


class SandboxBackend(Protocol):
    name: str

    def start(self, image: SandboxImage) -> Sandbox:
        """A ready sandbox of `image`, building (and caching per layer chain) whatever the image needs.
        Raises LayerBuildError for an image this backend cannot build, SandboxError for a failed start."""
