"""`manage.py evaluate --suite SUITE[@N] (--model model/SLUG[@N] | --checkpoint RUN@STEP|ALIAS | --endpoint SLUG)
[--headless] [--json] [--if-absent] [--project SLUG]`: evaluate one model on an eval suite.

Queued for the studio's workers by default (as the page and the API do); --headless evaluates in this process and
prints the scores per domain with their intervals. --if-absent does nothing when the same thing was already
evaluated under the suite's comparability key (`make demo` uses it)."""

import json

from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.evals import results
from apps.evals.models import Evaluation
from apps.evals.services import EvalError, evaluation_launch, target_resolve
from apps.evals.suites import NotASuite, suite_key
from apps.registry.errors import VersionNotFound
from apps.registry.refs import Ref, split_slug_ref
from apps.registry.selectors import version_resolve
from apps.runs.checkpoints import CheckpointNotFound


class Command(BaseCommand):
    help = "Evaluate a base model, a checkpoint or an endpoint on an eval suite."

    def add_arguments(self, parser):
        parser.add_argument("--suite", required=True, help="an eval suite: bundle SLUG, SLUG@N or SLUG@alias")
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--model", help="a model definition: model/SLUG[@N]")
        target.add_argument("--checkpoint", help="RUN@STEP (RUN a name or id; STEP a number or latest) or an alias")
        target.add_argument("--endpoint", help="an endpoint's slug")
        parser.add_argument("--trained-by", dest="trained_by",
                            help="for --model or --endpoint: the run trained elsewhere (its name or id) that trained "
                                 "the model; the leaderboard then scores apart the suite's tasks its bundle holds")
        parser.add_argument("--headless", action="store_true", help="evaluate in this process and print the scores")
        parser.add_argument("--json", action="store_true", dest="as_json")
        parser.add_argument("--if-absent", action="store_true",
                            help="do nothing if this was evaluated on the suite's key already")
        parser.add_argument("--project", help="project slug (default: the only project)")

    def handle(self, *args, suite, model, checkpoint, endpoint, headless, as_json, if_absent, project, trained_by=None,
               **_):
        scope = project_for_command(slug=project)
        try:
            version = version_resolve(project=scope, ref=Ref("bundle", *split_slug_ref(suite)))
            key, _ = suite_key(version)
            target = target_resolve(project=scope, model=model, checkpoint=checkpoint, endpoint=endpoint,
                                    trained_by=trained_by)
        except (VersionNotFound, NotASuite, CheckpointNotFound, ValueError, EvalError) as exc:
            raise CommandError(str(exc)) from None
        done = Evaluation.objects.filter(project=scope, key=key, model_version=target.get("model"),
                                         checkpoint=target.get("checkpoint"), endpoint=target.get("endpoint"))
        if if_absent and done.exists():
            self.stdout.write(f"already evaluated on {version.ref}: evaluation {done.first().pk}")
            return
        try:
            evaluation = evaluation_launch(project=scope, suite=version, actor=None, via="cli", **target)
        except EvalError as exc:
            raise CommandError(str(exc)) from None
        if not headless:
            self.stdout.write(f"evaluation {evaluation.pk} queued: {evaluation.label} on {version.ref} "
                              f"({evaluation.run.steps_total} batches)")
            return
        from apps.runs.attempts import Unfinished, run_attempt, stop_on_signals
        from apps.runs.services import run_claim

        attempt = run_claim(run_id=evaluation.run_id, stale_after=0)
        if attempt is None:
            raise CommandError("a worker took the evaluation first; follow it on its page")
        with stop_on_signals():  # Ctrl-C: the batches archived are kept and the evaluation is marked interrupted
            ending = run_attempt(run_id=evaluation.run_id, attempt=attempt)
        # Scores printed now would be those of the batches archived so far, under a status of "running": a script
        # reading them would take a part for the whole.
        if ending == Unfinished.TAKEN_OVER:
            raise CommandError(f"another worker took evaluation {evaluation.pk} over; follow it on its page")
        if ending == Unfinished.LEFT_TO_RESUME:
            raise CommandError(f"evaluation {evaluation.pk} stopped before its end (see the log): it is left to be "
                               f"resumed after its last archived batch (`manage.py train --resume {evaluation.run_id} "
                               "--headless`, or the studio's workers)")
        evaluation.refresh_from_db()
        [row] = results.leaderboard([evaluation]).rows
        scores = {domain: {"score": s.mean, "low": s.low, "high": s.high, "tasks": s.tasks, "samples": s.samples,
                           "method": s.method} for domain, s in row.scores.items()}
        out = {"evaluation": evaluation.pk, "what": evaluation.label, "suite": version.ref, "key": key,
               "status": evaluation.run.status, "infra_errors": row.infra_errors, "scores": scores}
        if as_json:
            self.stdout.write(json.dumps(out))
            return
        for domain, s in scores.items():
            interval = f"[{s['low']:.3f}, {s['high']:.3f}]" if s["low"] is not None else "(no interval)"
            self.stdout.write(f"{domain:20s} {s['score']:.3f} {interval} over {s['tasks']} tasks")
