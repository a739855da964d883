"""Checkpoint retention in the blob storage, locally and on an S3 bucket: a run keeps its newest
`keep_checkpoints` and every aliased checkpoint (copied, published whole, into checkpoints/kept/), which any host
then loads."""

import pytest

from apps.common import wiring
from apps.runs.attempts.evaluation import checkpoint_weights
from apps.runs.checkpoints import alias_move, checkpoint_resolve
from apps.runs.models import Checkpoint
from apps.runs.services import run_checkpoint_record, run_claim, run_create
from workers.rl.models.policies import TinyLMPolicy
from workers.rl.models.tiny_lm import ModelConfig, TinyLM
from workers.rl.training.checkpoint import checkpoints, save_checkpoint

KEEP = 2


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage_url(request, settings):
    """"" (the data directory) or the URL of an S3 bucket."""
    return request.getfixturevalue("object_store") if request.param == "s3" else ""


class Engine:
    """What a run's model is to a checkpoint: weights to save and restore, an engine to hand them to."""

    def __init__(self, seed: int):
        import torch

        torch.manual_seed(seed)
        self.policy = TinyLMPolicy(TinyLM(ModelConfig(vocab_size=16, n_embd=8, n_head=2, n_layer=1)))
        self.engine = self

    shares_weights = True

    def load_weights(self, state, step):
        self.step = step


def _train(run, attempt, policy, steps) -> None:
    """What a run's worker does at each step's checkpoint: save it (retention: the newest KEEP), then record it."""
    for step in steps:
        saved, removed = save_checkpoint(wiring.checkpoint_dir(run.pk), step=step, policy=policy,
                                         trainer_state={"step": step}, pipeline_state={"step": step}, keep=KEEP)
        run_checkpoint_record(run_id=run.pk, attempt=attempt, step=step, path=saved.path, size=saved.size,
                              removed=removed)


def test_a_run_keeps_its_newest_checkpoints_and_every_aliased_one(project, registry, owner, storage_url, settings,
                                                                  tmp_path):
    run = run_create(project=project, bundle=registry["bundle"], steps=6, name="learner", actor=owner)
    attempt = run_claim(run_id=run.pk, stale_after=0)
    trained = Engine(seed=1)
    settings.DATA_DIR = tmp_path / "worker-host"
    _train(run, attempt, trained.policy, [1, 2])
    alias_move(project=project, name="champion", checkpoint=checkpoint_resolve(project=project, name="learner@1"),
               actor=owner)
    _train(run, attempt, trained.policy, [3, 4, 5])

    assert [c.step for c in checkpoints(wiring.checkpoint_dir(run.pk))] == [4, 5]  # the run's newest KEEP
    assert sorted(Checkpoint.objects.filter(run=run).values_list("step", "kept")) == [(1, True), (4, False),
                                                                                      (5, False)]
    champion = checkpoint_resolve(project=project, name="champion")
    assert champion.step == 1 and f"/checkpoints/kept/{run.pk}/step-00000001" in champion.path
    if storage_url:
        assert champion.path.startswith(storage_url)
        assert not (tmp_path / "worker-host" / "checkpoints").exists()  # nothing of it on the worker's own disk

    settings.DATA_DIR = tmp_path / "web-host"  # another host loads the aliased checkpoint
    loaded = Engine(seed=2)
    checkpoint_weights(loaded, champion.path, champion.step)
    for name, value in trained.policy.model.state_dict().items():
        assert (value == loaded.policy.model.state_dict()[name]).all(), name
    latest = checkpoint_resolve(project=project, name="learner@latest")
    checkpoint_weights(loaded, latest.path, latest.step)
    assert loaded.step == 5
