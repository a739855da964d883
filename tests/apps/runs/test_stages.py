"""Stages: a run created with `model: checkpoint RUN@STEP` pins that checkpoint (start_from, in its config hash),
takes its model settings from the run that saved it, keeps it out of that run's retention, starts training from
exactly its weights, and the checkpoint page shows the lineage; a checkpoint that does not exist, or a LoRA shape
that contradicts it, is refused at the model field."""

import pytest
import torch
from django.urls import reverse

from apps.common import wiring
from apps.registry.pins import bundle_tasks
from apps.registry.services import version_publish
from apps.runs.attempts import run_attempt
from apps.runs.attempts.evaluation import checkpoint_model
from apps.runs.checkpoints import checkpoint_resolve
from apps.runs.models import Checkpoint, Run
from apps.runs.services import RunError, run_claim, run_create
from apps.runs.stages import lineage, start_weights
from workers.rl.models.hf_tiny import make_tiny_hf_model

SMALL = {"engine": "transformers", "mode": "sync", "groups_per_step": 2, "group_size": 2, "eval_tasks_per_domain": 0,
         "learning_rate": 0.05}


def _logits(model, ids):
    with torch.no_grad():
        return model.policy.model(ids).logits


@pytest.mark.sandbox
@pytest.mark.django_db(transaction=True)  # a training attempt closes its connection at the end, as workers do
def test_a_run_starts_from_another_runs_checkpoint(project, registry, owner, settings, tmp_path, client):
    settings.MODEL_DIRS = [tmp_path / "models"]
    settings.REMOTE_ROLLOUTS = False
    base = make_tiny_hf_model(tmp_path / "models" / "tiny-llama", hidden_size=32, layers=1, heads=2, max_positions=64)
    version_publish(project=project, kind="model", slug="tiny", author=owner,
                    spec={"source": {"type": "local", "path": str(base)}})
    first = run_create(project=project, bundle=registry["bundle"], steps=1, name="cold-start", actor=owner,
                       overrides={**SMALL, "model": "model/tiny", "lora_rank": 2})
    run_attempt(run_id=first.pk, attempt=run_claim(run_id=first.pk, stale_after=0))

    with pytest.raises(RunError, match="has no checkpoint at step 9") as missing:
        run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner,
                   overrides={**SMALL, "model": "checkpoint cold-start@9"})
    assert missing.value.errors[0].field == "model"
    with pytest.raises(RunError, match="lora_rank: 4 differs from 2") as clash:
        run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner,
                   overrides={**SMALL, "model": "checkpoint cold-start@1", "lora_rank": 4})
    assert clash.value.errors[0].field == "lora_rank"
    with pytest.raises(RunError, match="set by the studio"):
        run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner,
                   overrides={**SMALL, "start_from": {"run": str(first.pk), "step": 1}})

    second = run_create(project=project, bundle=registry["bundle"], steps=1, name="rl", actor=owner,
                        overrides={**SMALL, "model": "checkpoint cold-start@latest"})
    config = second.config
    assert config["start_from"] == {"run": str(first.pk), "run_name": "cold-start", "step": 1}
    assert (config["model"], config["model_version"], config["lora_rank"]) == (str(base), "model/tiny@1", 2)
    assert Checkpoint.objects.get(run=first, step=1).kept  # out of cold-start's retention
    assert second.config_hash != run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner,
                                            overrides={**SMALL, "model": "model/tiny", "lora_rank": 2}).config_hash

    # Its model starts as the checkpoint's, not as the base model.
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    saved = checkpoint_model(checkpoint_resolve(project=project, name="cold-start@1"))
    fresh = wiring.run_model(second.run_config, bundle_tasks(bundle=second.bundle, config=second.run_config))
    try:
        untrained = _logits(fresh, ids)
        start_weights(fresh, second)
        assert torch.allclose(_logits(fresh, ids), _logits(saved, ids), atol=1e-6)
        assert not torch.allclose(untrained, _logits(saved, ids), atol=1e-5)
    finally:
        saved.close()
        fresh.close()

    run_attempt(run_id=second.pk, attempt=run_claim(run_id=second.pk, stale_after=0))
    second.refresh_from_db()
    assert second.status == "completed" and second.checkpoints.filter(step=1).exists()
    third = run_create(project=project, bundle=registry["bundle"], steps=1, name="rl-again", actor=owner,
                       overrides={**SMALL, "model": "checkpoint rl@1"})
    assert [(run.name, step) for run, step in lineage(third)] == [("rl", 1), ("cold-start", 1)]

    client.force_login(owner)
    page = client.get(reverse("evals:checkpoints", kwargs={"project": project.slug})).content.decode()
    row = page[page.index('data-checkpoint="rl@1"'):]
    assert "cold-start@1" in row[:row.index("</tr>")]
    assert Run.objects.get(name="rl").config["start_from"]["run_name"] == "cold-start"
