"""`manage.py checkpoints export RUN STEP DIR`: a checkpoint of a LoRA run on a Hugging Face model becomes a
directory that transformers loads by itself, with the adapters merged: it computes what the checkpoint's model
computes. DIR may be a folder in an S3 bucket."""

import hashlib

import pytest
import torch
from django.core.management import CommandError, call_command

from apps.registry.services import version_publish
from apps.runs.attempts import run_attempt
from apps.runs.attempts.evaluation import checkpoint_model
from apps.runs.checkpoints import checkpoint_resolve
from apps.runs.services import run_claim, run_create
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.storage import Storage


def _train_lora(project, registry, owner, settings, tmp_path):
    """A one-step LoRA run `lora` on a tiny Hugging Face model; returns the base model's directory."""
    root = tmp_path / "models"
    settings.MODEL_DIRS = [root]
    settings.REMOTE_ROLLOUTS = False  # trained in this process: on services it would wait for rollout workers
    base = make_tiny_hf_model(root / "tiny-llama", hidden_size=32, layers=1, heads=2, max_positions=64)
    version_publish(project=project, kind="model", slug="tiny", author=owner,
                    spec={"source": {"type": "local", "path": str(base)}})
    run = run_create(project=project, bundle=registry["bundle"], steps=1, name="lora", actor=owner, overrides={
        "model": "model/tiny", "engine": "transformers", "mode": "sync", "lora_rank": 2, "groups_per_step": 2,
        "group_size": 2, "eval_tasks_per_domain": 0, "learning_rate": 0.05})
    run_attempt(run_id=run.pk, attempt=run_claim(run_id=run.pk, stale_after=0))
    return base


@pytest.mark.sandbox
@pytest.mark.django_db(transaction=True)  # a training attempt closes its connection at the end, as workers do
def test_a_lora_checkpoint_exports_as_a_loadable_merged_model(project, registry, owner, settings, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = _train_lora(project, registry, owner, settings, tmp_path)
    call_command("checkpoints", "export", "lora", "1", str(tmp_path / "exported"))

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "exported")
    ids = torch.tensor([tokenizer("12+30=", add_special_tokens=False)["input_ids"]])
    model = checkpoint_model(checkpoint_resolve(project=project, name="lora@1"))
    try:
        with torch.no_grad():
            theirs = model.policy.model(ids).logits
            ours = exported(ids).logits
    finally:
        model.close()
    original = AutoModelForCausalLM.from_pretrained(base).eval()
    with torch.no_grad():
        untrained = original(ids).logits
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert not torch.allclose(ours, untrained, atol=1e-5)  # the adapters' training is in it

    with pytest.raises(CommandError, match="has no checkpoint at step 7"):
        call_command("checkpoints", "export", "lora", "7", str(tmp_path / "nothing"))


@pytest.mark.sandbox
@pytest.mark.s3
@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_exports_to_a_folder_of_an_s3_bucket_published_whole(project, registry, owner, settings, tmp_path,
                                                                         object_store):
    _train_lora(project, registry, owner, settings, tmp_path)
    call_command("checkpoints", "export", "lora", "1", str(tmp_path / "exported"))
    call_command("checkpoints", "export", "lora", "1", object_store + "/exports/lora-1")

    manifest = Storage(object_store + "/exports").manifest("lora-1")
    local = {p.relative_to(tmp_path / "exported").as_posix(): p for p in (tmp_path / "exported").rglob("*")
             if p.is_file()}
    assert manifest["run"] and manifest["step"] == 1 and set(manifest["files"]) == set(local)
    for name, path in local.items():
        assert manifest["files"][name]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest(), name
    with pytest.raises(CommandError, match="name a folder inside the bucket"):
        call_command("checkpoints", "export", "lora", "1", object_store.rsplit("/", 1)[0])
