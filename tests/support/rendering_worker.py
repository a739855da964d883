"""`python -m tests.support.rendering_worker HOST celery-arguments...`: a `celery` command whose verifier also
draws a render for every answer it grades, as the mesh check draws a 3D answer, for the multi-host test
(tests/e2e/test_two_hosts.py).

Why: that test needs trajectories with renders written by a worker host, and the tiny demo model cannot write
the trimesh scripts the mesh check renders. Everything else in the worker is the studio's own code; only the
verdict gains an artifact: the mesh check's real renderer drawing a box whose size names the host
(`host_render`), so a test can tell which host's picture it is served.
"""

from __future__ import annotations

import functools
import sys

HOST_BOXES = {"host-a": (3.0, 2.0, 1.0), "host-b": (1.0, 2.0, 3.0)}
RENDER_NAME = "geometry/solid/render-iso.png"


@functools.cache
def host_render(host: str) -> bytes:
    """The PNG the worker of `host` attaches to every verdict (deterministic: the same box, the same bytes)."""
    import trimesh

    from workers.verifiers.mesh import render

    return render(trimesh.creation.box(extents=HOST_BOXES[host]), None, "iso")


def main() -> None:
    host, arguments = sys.argv[1], sys.argv[2:]
    from workers.rl.rollout import grading

    verify = grading.LocalVerifier.verify

    def verify_and_render(self, template, trajectory, item):
        verdict = verify(self, template, trajectory, item)
        verdict.artifacts[RENDER_NAME] = host_render(host)
        return verdict

    grading.LocalVerifier.verify = verify_and_render
    from celery.__main__ import main as celery

    sys.argv = ["celery", *arguments]
    sys.exit(celery())


if __name__ == "__main__":
    main()
