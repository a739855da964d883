"""`manage.py train --kind sft|dpo --dataset FILE.jsonl --headless --json`: the run trains on the file it pinned
(its path made absolute and its sha256), writes checkpoints and its metric points, and its page draws them in
panels of their own (loss, learning rate, gradient norm; DPO's implicit rewards and accuracy). A file that breaks
the row contract is refused naming its line before anything is queued, a GRPO run takes no dataset (nor an SFT
run a setting of GRPO's), and a file path is taken from the command line only. Without --bundle a run is on its
dataset alone: the model named by --set (the built-in demo model then pretrained on the dataset's conversations).
Dataset versions (dataset/SLUG@N): tests/apps/datasets."""

import json
import os
import signal
import threading
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.db.models import Max
from django.urls import reverse

from apps.runs.models import MetricPoint, Run
from apps.runs.services import RunError, run_create
from benchmarks.engine.supervised import addition_conversations, addition_preferences, write_jsonl
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.training.data_files import file_sha256

PANELS = {"sft": ("Training loss", "Learning rate", "Gradient norm"),
          "dpo": ("Training loss", "DPO: pairs whose chosen answer is preferred", "DPO: implicit rewards")}


@pytest.fixture
def tiny_model(settings, tmp_path):
    settings.MODEL_DIRS = [tmp_path / "models"]
    return make_tiny_hf_model(tmp_path / "models" / "tiny", hidden_size=32, layers=1, heads=2, max_positions=128)


def _settings(model):
    return ["--set", f"model={model}", "--set", "batch_size=2", "--set", "checkpoint_every=1"]


@pytest.mark.django_db(transaction=True)  # a training attempt closes its connection at the end, as workers do
@pytest.mark.parametrize(("kind", "rows"), [("sft", addition_conversations), ("dpo", addition_preferences)])
def test_a_run_trains_on_a_jsonl_file_and_its_page_draws_its_curves(project, registry, owner, login, tiny_model,
                                                                     tmp_path, kind, rows):
    data = write_jsonl(tmp_path / "data.jsonl", rows(4))
    out = StringIO()
    call_command("train", "--bundle", "arith-bundle", "--kind", kind, "--dataset", str(data), "--steps", "2",
                 "--headless", "--json", *_settings(tiny_model), stdout=out)
    summary = json.loads(out.getvalue())
    run = Run.objects.get(kind=kind)
    assert summary["outcome"] == "completed" and summary["kind"] == kind and summary["steps"] == 2
    assert (run.status, run.step) == ("completed", 2)
    assert (run.config["dataset_file"], run.config["dataset_sha256"]) == (str(data.resolve()), file_sha256(data))
    assert sorted(run.checkpoints.values_list("step", flat=True)) == [1, 2]
    names = set(MetricPoint.objects.filter(run=run, step=2).values_list("name", flat=True))
    assert {f"loss/{kind}", "optimizer/learning_rate", "optimizer/grad_norm",
            "throughput/sequence_tokens_per_second"} <= names
    if kind == "dpo":
        assert {"preference/reward_margin", "preference/accuracy", "preference/chosen_reward"} <= names
    page = login(owner).get(reverse("runs:run_detail", kwargs={"project": project.slug, "run_id": run.pk}))
    assert page.status_code == 200
    for title in PANELS[kind]:
        assert title in page.content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("kind", "rows", "model"), [("sft", addition_conversations, "tiny"),
                                                     ("dpo", addition_preferences, "default")])
def test_a_run_without_a_bundle_trains_on_its_dataset_alone(project, owner, login, tiny_model, tmp_path, settings,
                                                            kind, rows, model):
    settings.DEMO_PRETRAIN_SECONDS = 1  # the demo model, pretrained on the dataset's chosen answers
    data = write_jsonl(tmp_path / "sums.jsonl", rows(4))
    out = StringIO()
    given = _settings(tiny_model) if model == "tiny" else ["--set", "batch_size=2"]  # default: builtin:demo-tiny
    call_command("train", "--kind", kind, "--dataset", str(data), "--steps", "2", "--headless", "--json", *given,
                 stdout=out)
    summary = json.loads(out.getvalue())
    run = Run.objects.get(kind=kind)
    assert (summary["outcome"], summary["steps"], run.status, run.bundle) == ("completed", 2, "completed", None)
    assert run.name.startswith(f"{kind}-sums-") and run.trained_on == str(data)
    assert MetricPoint.objects.filter(run=run, name=f"loss/{kind}").count() == 2
    client = login(owner)
    page = client.get(reverse("runs:run_detail", kwargs={"project": project.slug, "run_id": run.pk})).content.decode()
    assert "Training loss" in page and str(data) in page
    assert str(data) in client.get(reverse("runs:run_list", kwargs={"project": project.slug})).content.decode()
    listed = client.get(f"/api/v1/projects/{project.slug}/runs").json()
    assert [(r["kind"], r["bundle"]) for r in listed] == [(kind, None)]
    again = client.get(reverse("runs:run_new", kwargs={"project": project.slug}) + f"?from_run={run.pk}")
    assert again.status_code == 200 and 'value="" selected' in again.content.decode()  # no bundle picked for it


@pytest.mark.django_db
def test_a_dataset_is_refused_where_it_cannot_be_trained_on(project, registry, owner, tiny_model, tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(addition_conversations(1)[0]) + "\n" + '{"messages": [{"role": "user"}]}\n')
    with pytest.raises(CommandError, match=r"broken.jsonl, line 2: messages\[0\]: a user message with no content"):
        call_command("train", "--bundle", "arith-bundle", "--kind", "sft", "--dataset", str(broken), "--steps", "1",
                     *_settings(tiny_model))
    good = write_jsonl(tmp_path / "good.jsonl", addition_conversations(2))
    with pytest.raises(CommandError, match="dataset is an SFT and DPO setting; a GRPO run does not use it"):
        call_command("train", "--bundle", "arith-bundle", "--dataset", str(good), "--steps", "1")
    with pytest.raises(CommandError, match="engine is a GRPO and evaluation setting; an SFT run does not use it"):
        call_command("train", "--bundle", "arith-bundle", "--kind", "sft", "--dataset", str(good), "--steps", "1",
                     "--set", "engine=transformers", *_settings(tiny_model))
    with pytest.raises(RunError, match="a grpo run needs a bundle"):
        run_create(project=project, bundle=None, steps=1, overrides={"model": str(tiny_model)})
    with pytest.raises(CommandError, match="a dpo run trains on preference rows|a preference row is"):
        call_command("train", "--bundle", "arith-bundle", "--kind", "dpo", "--dataset", str(good), "--steps", "1",
                     *_settings(tiny_model))
    with pytest.raises(RunError, match="taken from the command line only") as refused:
        run_create(project=project, bundle=registry["bundle"], steps=1, kind="sft", actor=owner, via="web",
                   overrides={"dataset": str(good), "model": str(tiny_model)})
    assert refused.value.errors[0].field == "dataset"
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_ctrl_c_of_a_headless_run_keeps_its_last_finished_step_and_marks_it_interrupted(project, registry, tiny_model,
                                                                                        tmp_path):
    """`train --headless` stopped by Ctrl-C (SIGINT to its process) checkpoints the step it finished, even off the
    checkpoint schedule, and the run is interrupted, not left "running" with nothing running; `--resume` goes on
    from there to the end."""
    data = write_jsonl(tmp_path / "data.jsonl", addition_conversations(4))
    steps = 400

    done = threading.Event()

    def interrupt_after_some_steps():  # Ctrl-C once the run has recorded its third step
        connection = connections.create_connection("default")
        try:
            while not done.wait(0.02):
                with connection.cursor() as cursor:
                    cursor.execute("SELECT max(step) FROM runs_metricpoint")
                    if (cursor.fetchone()[0] or 0) >= 3:
                        os.kill(os.getpid(), signal.SIGINT)
                        return
        finally:
            connection.close()

    threading.Thread(target=interrupt_after_some_steps, daemon=True).start()
    out = StringIO()
    call_command("train", "--bundle", "arith-bundle", "--kind", "sft", "--dataset", str(data), "--steps", str(steps),
                 "--headless", "--json", "--set", f"model={tiny_model}", "--set", "batch_size=2",
                 "--set", "checkpoint_every=1000", stdout=out, stderr=StringIO())
    done.set()
    summary = json.loads(out.getvalue())
    run = Run.objects.get(kind="sft")
    assert summary["outcome"] == "interrupted" and run.status == "interrupted"
    assert 3 <= run.step < steps
    assert list(run.checkpoints.values_list("step", flat=True)) == [run.step]  # off schedule: the step it finished
    assert MetricPoint.objects.filter(run=run).aggregate(Max("step"))["step__max"] == run.step

    interrupted_at = run.step
    out = StringIO()
    call_command("train", "--resume", str(run.pk), "--headless", "--json", stdout=out, stderr=StringIO())
    summary = json.loads(out.getvalue())
    run.refresh_from_db()
    assert (summary["outcome"], summary["resumed_from_step"], run.status, run.step) == (
        "completed", interrupted_at, "completed", steps)
