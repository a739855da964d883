"""A suite over the registry fixture's arithmetic domain, and the built-in demo model as a definition."""

import pytest

from apps.registry.services import version_publish

SUITE = {"members": ["domain/arithmetic@latest"],
         "evaluation": {"tasks_per_template": 8, "samples_per_task": 2, "temperature": 1.0, "seed": 1}}


@pytest.fixture
def suite(project, registry, owner):
    return version_publish(project=project, kind="bundle", slug="arith-suite", spec=SUITE, author=owner).version


@pytest.fixture
def tiny(project, owner, settings):
    settings.DEMO_PRETRAIN_SECONDS = 2  # the demo model, pretrained for two seconds on the suite's tasks
    return version_publish(project=project, kind="model", slug="demo-tiny",
                           spec={"source": {"type": "builtin", "name": "demo-tiny"}}, author=owner).version


@pytest.fixture(autouse=True)
def local_rollouts(settings):
    """The training runs these tests run in their own process verify there too: on services (CI sets REDIS_URL)
    they would send their tool calls and verifications to rollout and verify workers no test started."""
    settings.REMOTE_ROLLOUTS = False
