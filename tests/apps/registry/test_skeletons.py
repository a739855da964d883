"""The "start from an empty skeleton" specs (apps/registry/skeletons.py): each validates as its kind, and the
bundle's names its model rather than leaving a run on the default silently."""

import pytest

from apps.registry.files import load_yaml
from apps.registry.services import spec_check
from apps.registry.skeletons import SKELETONS
from workers.definitions.specs import validate_spec
from workers.rl.config import GRPOConfig


@pytest.mark.parametrize("kind", sorted(SKELETONS))
def test_each_skeleton_validates_as_its_kind(kind):
    validate_spec(kind, load_yaml(SKELETONS[kind]))


def test_the_bundle_skeleton_names_its_model_and_publishes_in_a_project_with_its_domain(project, registry):
    spec = load_yaml(SKELETONS["bundle"])
    assert spec["run_config"]["model"] == GRPOConfig().model == "builtin:demo-tiny"
    assert "builtin:smollm2-135m-instruct" in SKELETONS["bundle"]  # the comment says what else it can be
    stored = spec_check(project=project, kind="bundle", slug="from-the-skeleton", spec=spec)
    assert stored["run_config"] == {"model": "builtin:demo-tiny"}
