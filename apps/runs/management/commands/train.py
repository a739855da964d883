"""`manage.py train --bundle SLUG[@N] --steps N [--headless] [--json] [--set KEY=VALUE ...] [--if-idle] [--prepare]`:
start a run. `manage.py train --resume ID --headless`: train an existing run here, from its newest checkpoint.
`--kind sft|dpo --dataset FILE.jsonl|dataset/SLUG@N`: supervised fine-tuning or DPO on a dataset
(workers/rl/training/data_files.py) instead of GRPO. With --bundle, the bundle gives the model and its settings;
without, the run is on its dataset alone: the model is `--set model=...` (default builtin:demo-tiny, then
pretrained on the dataset's own conversations) and the settings are the defaults and --set.

Headless, the run trains in this process with a progress bar on stderr and ends with its summary (JSON with
--json): per-domain reward at the start and the end, trajectories and effective trajectories per hour,
cost per task, the trainer's idle time by cause. Without --headless the run is queued for the studio's
workers (Celery's gpu queue, or the embedded training of `make demo`) and its page is printed.

Data-parallel: `torchrun --nproc-per-node N manage.py train ... --headless` trains one run on N processes
(workers/rl/training/distributed.py). Rank 0 does everything this command does alone (creates or claims the run, rolls
out, writes the database, the archive and the checkpoints, prints); the other ranks compute gradients on their
shard of each step, sample rollouts for rank 0, and print how many updates they took part in. A run whose config
asks for `data_parallel: N` starts those processes itself wherever it trains (apps/runs/ranks.py).
"""

import json

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from apps.accounts.selectors import project_for_command
from apps.common import wiring
from apps.registry.errors import VersionNotFound
from apps.registry.pins import bundle_tasks
from apps.registry.refs import Ref, split_slug_ref
from apps.registry.selectors import version_resolve
from apps.runs.attempts import Unfinished, run_attempt, stop_on_signals
from apps.runs.dataset_pins import dataset_here
from apps.runs.dispatch import run_enqueue
from apps.runs.models import ACTIVE_STATUSES, DATASET_KINDS, TRAINING_KINDS, EventKind, Run, RunKind, RunStatus
from apps.runs.services import RunError, run_claim, run_create, run_request
from workers.rl.models.packaged import PACKAGED_MODELS
from workers.rl.training import distributed


def parse_setting(text: str) -> tuple[str, object]:
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise CommandError(f"--set {text!r}: write KEY=VALUE, e.g. --set mode=sync")
    try:
        return name.strip(), json.loads(raw)
    except ValueError:
        return name.strip(), raw


class Command(BaseCommand):
    help = "Start a training run on a bundle (headless: train here and print the summary)."

    def add_arguments(self, parser):
        parser.add_argument("--bundle", help="bundle SLUG, SLUG@N or SLUG@alias (a new run; optional for sft and dpo, "
                                             "which may train on --dataset alone)")
        parser.add_argument("--steps", type=int, help="trainer steps (a new run)")
        parser.add_argument("--kind", choices=[str(k) for k in TRAINING_KINDS], default=RunKind.GRPO,
                            help="grpo (default): sample, verify, train; sft or dpo: train on --dataset")
        parser.add_argument("--dataset", default="",
                            help="sft, dpo: a JSONL file of {messages} rows (sft) or {prompt, chosen, rejected} rows "
                                 "(dpo), TRL's conversational formats, or a dataset version (dataset/SLUG@N); the "
                                 "run pins its sha256")
        # Not --run: torchrun's own parser would take it for an abbreviation of its --run-path.
        parser.add_argument("--resume", dest="run_id", metavar="ID",
                            help="train this existing run here (with --headless) from its newest checkpoint: a "
                                 "queued or interrupted one, a paused one (resumed first), or one whose worker "
                                 "stopped heartbeating")
        parser.add_argument("--project", help="project slug (default: the only project)")
        parser.add_argument("--name", default="", help="the run's name (default: bundle and time)")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                            help="a setting of the run's kind (GRPOConfig, SFTConfig or DPOConfig in "
                                 "workers/rl/config.py), VALUE as JSON or text; repeatable")
        parser.add_argument("--headless", action="store_true", help="train in this process until the run ends")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the summary as one JSON object")
        parser.add_argument("--if-idle", action="store_true",
                            help="queue nothing if the project already has a queued or running training run; resume "
                                 "its interrupted one instead of queueing a new one (make demo)")
        parser.add_argument("--prepare", action="store_true",
                            help="before queueing, pretrain (demo-tiny) or convert (packaged models) the built-in "
                                 "base model here if it is not cached, so the worker starts training at once")

    def handle(self, *args, **options):
        if distributed.topology_from_env() is None:
            return self.start(**options)
        if not options["headless"]:
            raise CommandError("under torchrun the run trains in these processes: add --headless")
        topology = distributed.setup()
        try:
            if not topology.leader:  # no database, no archive, no checkpoints: gradients for rank 0
                updates = distributed.follow()
                Console(stderr=True).print(f"rank {topology.rank}: took part in {updates} updates")
                return
            with distributed.leading():
                self.start(**options)
        finally:
            distributed.teardown()

    def start(self, *, bundle, steps, run_id, project, name, overrides, headless, as_json, if_idle, prepare, kind,
              dataset, **_):
        console = Console(stderr=True)
        if run_id:
            if not headless:
                raise CommandError("--resume trains the run here: add --headless")
            return self.resume(run_id, console, as_json)
        if steps is None or not (bundle or kind in DATASET_KINDS):
            raise CommandError("a new run needs --steps and --bundle (sft and dpo: --bundle or --dataset alone), or "
                               "--resume ID for an existing one")
        try:
            scope = project_for_command(slug=project)
            version = version_resolve(project=scope, ref=Ref("bundle", *split_slug_ref(bundle))) if bundle else None
            # Training runs only: an evaluation queued meanwhile (a run that trains nothing) does not count.
            training = Run.objects.filter(project=scope, kind__in=TRAINING_KINDS)
            active = training.filter(status__in=ACTIVE_STATUSES).first()
            if if_idle and active is not None:
                console.print(f"run [bold]{active.name}[/] is already {active.status}; queued nothing")
                return
            interrupted = training.filter(status=RunStatus.INTERRUPTED).order_by("created_at").first()
            if if_idle and interrupted is not None:
                stopped = interrupted.events.filter(kind=EventKind.INTERRUPTED).last()
                run_request(run=interrupted, action="resume", actor=None, via="cli")
                console.print(f"resuming run [bold]{interrupted.name}[/]: {stopped.message}; queued nothing new")
                return
            settings_given = dict(parse_setting(s) for s in overrides)
            if dataset:
                settings_given["dataset"] = dataset
            run = run_create(project=scope, bundle=version, steps=steps, name=name, via="cli", kind=kind,
                             overrides=settings_given, enqueue=not headless and not prepare)
        except (LookupError, VersionNotFound, RunError) as exc:
            raise CommandError(str(exc))
        if prepare:
            self.prepare(run, console)
        if not headless:
            if prepare:  # queued once its base model is ready, so the worker starts training at once
                run_enqueue(run)
            console.print(f"queued run [bold]{run.name}[/] ({run.id}) on {run.trained_on}; "
                          f"its page: /p/{scope.slug}/runs/{run.id}/")
            return
        self.train_and_report(run, run_claim(run_id=run.pk, stale_after=0), console, as_json)

    def resume(self, run_id, console, as_json):
        try:
            run = Run.objects.get(pk=run_id)
        except (Run.DoesNotExist, ValueError, ValidationError):
            raise CommandError(f"no run {run_id}") from None
        if run.status == RunStatus.PAUSED:
            run = run_request(run=run, action="resume", actor=None, via="cli", enqueue=False)
        attempt = run_claim(run_id=run.pk, stale_after=settings.RUN_STALE_SECONDS)
        if attempt is None:
            raise CommandError(f"run {run.name} is {run.status}: only a queued, paused or interrupted run, or a "
                               f"running one whose worker has not heartbeaten for {settings.RUN_STALE_SECONDS:g} s, "
                               "can train here")
        self.train_and_report(run, attempt, console, as_json)

    def train_and_report(self, run, attempt, console, as_json):
        ending = self.train(run, attempt, console)
        if ending == Unfinished.TAKEN_OVER:
            raise CommandError("another worker took this run over")
        if ending == Unfinished.LEFT_TO_RESUME:
            raise CommandError(f"the attempt stopped before its end (see the log); run {run.name} is left to be "
                               f"resumed from its newest checkpoint (train --resume {run.pk} --headless)")
        self.stdout.write(_dumps(ending, indent=None if as_json else 2))

    def prepare(self, run, console):
        config = run.run_config
        if config.model in PACKAGED_MODELS:
            with console.status(f"converting {config.model} to safetensors (once per data directory, ~30-45 s)"):
                path = wiring.packaged_model(config.model)
            console.print(f"base model ready: {path}")
            return
        if not config.model.startswith("builtin:"):
            return
        if run.bundle is None:  # pretrained on the run's dataset: build the model as the worker will
            config = dataset_here(project=run.project, config=config)
            with console.status("pretraining the demo base model on the dataset"):
                wiring.run_model(config, None, dataset_file=config.dataset_file, sampling=False).close()
            return
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[status]}"), console=console) as progress:
            task = progress.add_task("pretraining the demo base model", total=None, status="")
            path = wiring.demo_base_model(bundle_tasks(bundle=run.bundle),
                                          progress=lambda step, loss, seconds: progress.update(
                                              task, completed=step, status=f"loss {loss:.3f} {seconds:.0f}s"))
        console.print(f"base model ready: {path}")

    def train(self, run, attempt, console):
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[status]}"))
        with Progress(*columns, console=console, transient=False) as progress:
            pretraining = progress.add_task("pretraining the base model", total=None, status="", visible=False)
            training = progress.add_task(f"training {run.name}", total=run.steps_total, status="")

            def pretrain_progress(step, loss, seconds):
                progress.update(pretraining, visible=True, completed=step, status=f"loss {loss:.3f} {seconds:.0f}s")

            def step_progress(step, total, points):
                loss = points.get("loss/sft", points.get("loss/dpo"))
                if loss is not None:  # SFT, DPO
                    progress.update(training, completed=step, status=f"loss {loss:.4f} · " + (
                        f"accuracy {points['preference/accuracy']:.2f} · " if "preference/accuracy" in points else
                        "") + f"{points['throughput/sequence_tokens_per_second']:,.0f} tokens/s")
                    return
                reward = points.get("reward/mean")
                per_hour = points.get("throughput/effective_trajectories_per_hour", 0)
                progress.update(training, completed=step, status=(
                    f"reward {reward:.3f} · " if reward is not None else "") + f"{per_hour:,.0f} effective traj/h · "
                    f"busy {points.get('trainer/busy_fraction', 0):.0%}")

            with stop_on_signals():  # Ctrl-C: the run keeps its last finished step and is marked interrupted
                return run_attempt(run_id=run.pk, attempt=attempt, progress=step_progress,
                                   pretrain_progress=pretrain_progress)


def _dumps(data, indent):
    return json.dumps(data, indent=indent, default=str)
