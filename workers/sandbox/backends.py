"""Choosing a backend by name (settings.SANDBOX_BACKEND; the studio's wiring passes its directories too)."""

from pathlib import Path

from .interface import SandboxBackend

BACKENDS = ("process", "docker")


def backend_named(name: str, *, layer_cache: Path | None = None, docker_control: Path | None = None,
                  network_allowed: bool = False) -> SandboxBackend:
    """`layer_cache`: where the process backend keeps built image layers; `docker_control`: where the docker
    backend keeps its containers' control sockets (each defaults to a folder under /var/tmp); `network_allowed`:
    whether an image asking for the network (limits.network) gets the host's (otherwise it cannot start)."""
    if name == "process":
        from .layers import LayerCache
        from .process import ProcessBackend

        return ProcessBackend(layers=LayerCache(layer_cache) if layer_cache else None,
                              network_allowed=network_allowed)
    if name == "docker":
        from .docker import DockerBackend

        return DockerBackend(network_allowed=network_allowed,
                             **({"control_root": docker_control} if docker_control else {}))
    raise ValueError(f"unknown sandbox backend {name!r}; choose one of {', '.join(BACKENDS)}")
