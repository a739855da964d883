"""The real-model demo's SFT cold start: before GRPO, a short supervised fine-tuning of SmolLM2-135M on its bundle's
own reference check — every reference answer that passed, of every template — so that a tool call is where RL starts
on the tool template, not something it has to stumble on (issue 28: without it, 8 of 1,352 rollouts called the tool).
Every template, not the tool-calling answers alone: trained on those alone (30 steps on 24 rows), SmolLM2 called
run_python on every task, the sums and functions included, and scored 0 on both before and after GRPO.

`cold_start(bundle=...)` builds dataset `<bundle>-cold-start` from the newest reference check of the bundle (the same
version again when its rows are the same) and trains SFT run `<bundle>-sft` on it here, unless a completed run of
that name already trained on that version; the GRPO run then starts from its last checkpoint
(`model: checkpoint <bundle>-sft@latest`, apps/runs/stages.py).
"""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command

from apps.accounts.models import Project
from apps.datasets.errors import DatasetError
from apps.datasets.services import dataset_build
from apps.runs.models import Run, RunKind, RunStatus

# SFT on a few dozen short conversations: a LoRA of the bundle's shape (its run_config), a learning rate above
# GRPO's (each row is a right answer, not a noisy advantage), a batch that covers them in a few steps: 18 steps of 8
# are two passes over the demo's 72 rows (24 a template).
SFT_SETTINGS = {"learning_rate": 5e-4, "batch_size": 8, "eval_tasks_per_domain": 0}
STEPS = 18


def run_name(bundle: str) -> str:
    return f"{bundle}-sft"


def cold_start(*, project: Project, bundle: str, steps: int = STEPS, stdout=None) -> Run:
    """The completed SFT run the GRPO run starts from, trained here if it is not there yet."""
    try:
        dataset = dataset_build(
            project=project, slug=f"{bundle}-cold-start", fmt="sft", actor=None, via="cli",
            description=f"The trajectories of {bundle}'s reference check that passed, every template's: the SFT cold "
                        "start before GRPO",
            sources=[{"type": "reference_check", "bundle": bundle}]).version
    except DatasetError as exc:
        raise DatasetError(f"no cold start for {bundle}: {exc}. The reference check's run page says why its "
                           "references did not pass (ungraded: a sandbox that did not start, a judge not "
                           "configured); run manage.py reference_check again once they can") from None
    done = Run.objects.filter(project=project, kind=RunKind.SFT, name=run_name(bundle), status=RunStatus.COMPLETED,
                              config__dataset=dataset.ref).order_by("-created_at").first()
    if done is not None:
        if stdout:
            stdout.write(f"{done.name} already trained on {dataset.ref}; the GRPO run starts from it")
        return done
    settings = [item for name, value in SFT_SETTINGS.items() for item in ("--set", f"{name}={value}")]
    call_command("train", "--project", project.slug, "--bundle", bundle, "--kind", RunKind.SFT, "--dataset",
                 dataset.ref, "--steps", str(steps), "--name", run_name(bundle), "--headless", "--json", *settings,
                 stdout=stdout or StringIO())
    return Run.objects.filter(project=project, kind=RunKind.SFT, name=run_name(bundle)).latest("created_at")
