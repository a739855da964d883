"""Choosing a backend by name (settings: STUDIO_SANDBOX_BACKEND)."""

from .interface import SandboxBackend

BACKENDS = ("process", "docker")


def backend_named(name: str) -> SandboxBackend:
    if name == "process":
        from .process import ProcessBackend

        return ProcessBackend()
    if name == "docker":
        from .docker import DockerBackend

        return DockerBackend()
    raise ValueError(f"unknown sandbox backend {name!r}; choose one of {', '.join(BACKENDS)}")
