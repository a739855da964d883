"""The hundred-domain demo (`make demo DOMAINS=reasoning-gym`, apps/demo/generated.py): the Makefile trains the
bundles the demo publishes, and each bundle's run settings are ones a GRPO run accepts."""

import subprocess
from pathlib import Path

import pytest

from apps.demo.generated import BUNDLES, MAX_TOKENS
from workers.rl.config import GRPOConfig

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("model", "bundle"), [("tiny", "demo-reasoning-gym"),
                                               ("smollm", "demo-reasoning-gym-smollm")])
def test_make_demo_with_reasoning_gym_trains_the_bundle_published_for_its_model(model, bundle):
    planned = subprocess.run(["make", "-n", "-C", str(ROOT), "demo", "DOMAINS=reasoning-gym", f"MODEL={model}"],
                             capture_output=True, text=True, check=True).stdout
    planned = "\n".join(line.rstrip() for line in planned.splitlines()) + "\n"
    assert "seed_demo --domains reasoning-gym" in planned
    assert f"train --bundle {bundle} " in planned and bundle in BUNDLES
    assert "demo-smollm" not in planned.replace(bundle, "")  # nothing of the six-domain real-model demo
    if model == "smollm":  # an SFT cold start on every template's references, the GRPO run from its checkpoint
        assert f"cold_start --bundle {bundle}\n" in planned
        assert f'--set "model=checkpoint {bundle}-sft@latest"' in planned
    else:
        assert "cold_start" not in planned


def test_the_demo_bundles_run_settings_resolve_and_keep_the_evaluation_small():
    for draft in BUNDLES.values():
        resolved = GRPOConfig.resolve(draft.spec["run_config"])
        assert 1 <= resolved.eval_tasks_per_domain <= 4 and resolved.curriculum
    smol = GRPOConfig.resolve(BUNDLES["demo-reasoning-gym-smollm"].spec["run_config"])
    assert 0 < smol.context_length and MAX_TOKENS < smol.context_length // 4
