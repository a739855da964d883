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
from apps.runs.models import Checkpoint
from apps.runs.services import RunError, run_checkpoint_record, run_claim, run_create
from apps.runs.stages import lineage
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.training.checkpoint import save_checkpoint

# One group of two rollouts a step, no search for groups with signal: the step is what is tested, not learning.
SMALL = {"engine": "transformers", "mode": "sync", "groups_per_step": 1, "group_size": 2, "dynamic_sampling": False,
         "eval_tasks_per_domain": 0, "learning_rate": 0.05}


def _logits(model, ids):
    with torch.no_grad():
        return model.policy.model(ids).logits


def _saved_stage(run, model, step: int) -> None:
    """What a run's worker does at a checkpoint (save it, record it), for a model changed by hand, not trained."""
    attempt = run_claim(run_id=run.pk, stale_after=0)
    saved, removed = save_checkpoint(wiring.checkpoint_dir(run.pk), step=step, policy=model.policy,
                                     trainer_state={"step": step}, pipeline_state={"step": step}, keep=3,
                                     attempt=attempt)
    run_checkpoint_record(run_id=run.pk, attempt=attempt, step=step, path=saved.path, size=saved.size,
                          removed=removed)


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
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    stage = wiring.run_model(first.run_config, bundle_tasks(bundle=first.bundle, config=first.run_config))
    try:
        untrained = _logits(stage, ids)
        with torch.no_grad():  # its adapters moved away from zero: a model unlike the base
            for parameter in stage.policy.trainable_parameters():
                parameter.add_(torch.randn_like(parameter) * 0.5)
        started = _logits(stage, ids)
        _saved_stage(first, stage, step=1)
    finally:
        stage.close()
    assert not torch.allclose(untrained, started, atol=1e-4)

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

    # A learning rate of almost nothing: what the run saves after its step is what it started from.
    second = run_create(project=project, bundle=registry["bundle"], steps=1, name="rl", actor=owner,
                        overrides={**SMALL, "model": "checkpoint cold-start@latest", "learning_rate": 1e-12})
    config = second.config
    assert config["start_from"] == {"run": str(first.pk), "run_name": "cold-start", "step": 1}
    assert (config["model"], config["model_version"], config["lora_rank"]) == (str(base), "model/tiny@1", 2)
    assert Checkpoint.objects.get(run=first, step=1).kept  # out of cold-start's retention
    assert second.config_hash != run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner,
                                            overrides={**SMALL, "model": "model/tiny", "lora_rank": 2,
                                                       "learning_rate": 1e-12}).config_hash
    run_attempt(run_id=second.pk, attempt=run_claim(run_id=second.pk, stale_after=0))
    second.refresh_from_db()
    assert second.status == "completed"
    trained = checkpoint_model(checkpoint_resolve(project=project, name="rl@1"))
    try:
        assert torch.allclose(_logits(trained, ids), started, atol=1e-4)
    finally:
        trained.close()

    third = run_create(project=project, bundle=registry["bundle"], steps=1, name="rl-again", actor=owner,
                       overrides={**SMALL, "model": "checkpoint rl@1"})
    assert [(run.name, step) for run, step in lineage(third)] == [("rl", 1), ("cold-start", 1)]
    client.force_login(owner)
    run_page = client.get(reverse("runs:run_detail", kwargs={"project": project.slug, "run_id": second.pk}))
    assert f'/runs/{first.pk}/">cold-start@1</a>' in run_page.content.decode()
    page = client.get(reverse("evals:checkpoints", kwargs={"project": project.slug})).content.decode()
    row = page[page.index('data-checkpoint="rl@1"'):]
    assert "cold-start@1" in row[:row.index("</tr>")]
