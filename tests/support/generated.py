"""The reasoning-gym sandbox image the generated tasks are scored in, for the tests that score them (mark them
`sandbox`). Its layer is built in the studio's own layer cache (settings.SANDBOX_LAYER_CACHE, as `tasks
from-generator` builds it), so pip installs the library once per machine, not once per test session."""

from __future__ import annotations

from contextlib import contextmanager
from importlib import metadata

from apps.common import wiring
from apps.task_import.generated import IMAGE_BUILD_SECONDS, image_spec
from tests.support.resources import require
from workers.sandbox import Execution, SandboxImage, Status

VERSION = metadata.version("reasoning-gym")
IMAGE = SandboxImage.from_spec("sandbox_image/reasoning-gym@tests", image_spec(VERSION))


@contextmanager
def generated_pool():
    """A pool with IMAGE's sandboxes started (its layer built, if this machine has none yet)."""
    require("sandbox")
    pool = wiring.sandbox_pool()
    try:
        started = pool.execute(IMAGE, Execution(program="import reasoning_gym"), timeout=IMAGE_BUILD_SECONDS)
        assert started.status == Status.OK, started.reason + started.stderr.decode()[-500:]
        yield pool
    finally:
        pool.close()
