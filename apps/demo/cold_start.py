"""The real-model demo's SFT cold start: before GRPO, a short supervised fine-tuning of SmolLM2-135M on its bundle's
own reference check — the reference answers that passed, of the templates it is given (default: every template) —
so that a tool call is where RL starts on the tool template, not something it has to stumble on (issue 28: without
it, 8 of 1,352 rollouts called the tool).

Which templates, measured on demo-smollm (24 references a template, held-out start scores of 16 tasks a domain, the
first GRPO step's rollouts): the base model starts at sums 0.19, functions 0.25, tools 0.0. Trained on every
template (18 steps), the sums' references, the bare number, taught it to answer with a number and nothing else,
mostly one copied from the question ("What is 8+10?" → 90, 10, 20): sums 0.125 at the start, 0.125 at the end of
GRPO — and on the tool-calling answers alone (30 steps) it called run_python on every task. Trained on the tool and
function templates (9 steps), the templates whose references show how the answer is reached, it starts at sums 0.19
(as the base: it still works sums out, "8 + 10 = 18"), functions 0.63, tools 0.88. So `make demo MODEL=smollm` names
those two (Makefile, COLD_START_TEMPLATES).

The GRPO stage after it has settings of its own (Makefile, AFTER_COLD_START): the sums 6 : functions 0.25 : tools
0.25 instead of the bundle's 4 : 1 : 1, and a learning rate of 4e-4 instead of 2e-4. The cold start leaves the tools
and functions nearly solved and the sums where the base model was. With the bundle's mix a cold-started step cost
more than a plain one (37.9 s against 29.4 s, 18 steps): a third of the rounds carried a tool group, two generations
each. Measured on demo-smollm from this cold start (2 cores, held-out scores of 16 tasks a domain, sums / functions /
tools, from 0.19 / 0.63 / 0.88): sums 6 : functions 1 : tools 0.25 at 2e-4, 18 steps, end 0.75 / 1.0 / 1.0, and 22
steps 0.81 / 1.0 / 1.0; the same mix at 4e-4, 16 steps, 0.81 / 0.94 / 1.0, but 13 of its 21 function groups all
passed (no signal: the step drew again) and a step that held one took 9 to 54 s against 6 to 10 s for sums alone;
sums 6 : functions 0.25 : tools 0.25 at 4e-4, 16 steps, 0.875 / 1.0 / 1.0. The README quotes it against the run
without a cold start.

`cold_start(bundle=..., templates=...)` builds dataset `<bundle>-cold-start` from the newest reference check of the
bundle (the same version again when its rows are the same) and trains SFT run `<bundle>-sft` on it here, unless a
completed run of that name already trained on that version; the GRPO run then starts from its last checkpoint
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
# GRPO's (each row is a right answer, not a noisy advantage), a batch that covers them in a few steps: 9 steps of 8
# are one and a half passes over the demo's 48 rows (24 a template, two templates). Longer overfits: after 18 steps
# on every template the loss was 0.008 and a GRPO group's eight samples mostly one answer, no signal to learn from.
SFT_SETTINGS = {"learning_rate": 5e-4, "batch_size": 8}
STEPS = 9


def run_name(bundle: str) -> str:
    return f"{bundle}-sft"


def cold_start(*, project: Project, bundle: str, templates: tuple[str, ...] = (), steps: int = STEPS,
               stdout=None) -> Run:
    """The completed SFT run the GRPO run starts from, trained here if it is not there yet. `templates`: the task
    template slugs whose references it trains on; none, every template's."""
    which = ", ".join(templates) if templates else "every template"
    sources = ([{"type": "reference_check", "bundle": bundle, "template": slug} for slug in templates]
               or [{"type": "reference_check", "bundle": bundle}])
    try:
        dataset = dataset_build(
            project=project, slug=f"{bundle}-cold-start", fmt="sft", actor=None, via="cli",
            description=f"The trajectories of {bundle}'s reference check that passed ({which}): the SFT cold start "
                        "before GRPO",
            sources=sources).version
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
