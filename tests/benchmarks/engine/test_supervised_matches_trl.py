"""Our SFT and DPO losses are TRL's: the same rows through our trainer and through TRL's SFTTrainer and
DPOTrainer (benchmarks/engine/supervised.py, as `bench trainer --workloads sft dpo` runs them), masked by each
side's own code — ours from the model's chat template, TRL's from the same template with its {% generation %}
markers — give the same loss at the first step and, every weight trained at the same learning rate, at the steps
after it; for DPO, whose first loss is ln 2 on both sides whatever the masks (the policy is still the reference),
also the same summed log-probabilities of the chosen and rejected answers."""

import math

import pytest

from benchmarks.engine.supervised import TINY_TEMPLATE_MARKED, SupervisedWorkload, compare_supervised
from workers.rl.models.hf_tiny import make_tiny_hf_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_hf_model(tmp_path_factory.mktemp("model") / "tiny", hidden_size=32, layers=2, heads=2)


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_our_losses_are_trls_on_the_same_rows(tiny_model, kind):
    work = SupervisedWorkload(kind, tiny_model, TINY_TEMPLATE_MARKED, rows=4, learning_rate=1e-2)
    result = compare_supervised(work, 3)
    ours, trl = result["ours"], result["trl"]
    assert ours["first_step_loss"] == pytest.approx(trl["first_step_loss"], abs=1e-5)
    assert ours["losses"] == pytest.approx(trl["losses"], rel=1e-3)
    assert len(set(ours["losses"])) == 3  # the steps after the first moved the loss: the updates are compared
    if kind == "dpo":
        assert ours["first_step_loss"] == pytest.approx(math.log(2))
        for name in ("first_step_logprob_chosen", "first_step_logprob_rejected"):
            assert ours[name] == pytest.approx(trl[name], abs=1e-4)
        assert ours["first_step_logprob_chosen"] != ours["first_step_logprob_rejected"]
    assert result["seconds_per_step_ratio_trl_over_ours"] > 0  # both sides timed (the targets are the bench's)
