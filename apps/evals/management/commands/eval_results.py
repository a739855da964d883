"""`manage.py eval_results export EVALUATION --format jsonl|lm-eval --out PATH` and `manage.py eval_results import
FILE [--label MODEL]`: an evaluation's per-task results out as JSONL (a row per answer) or as lm-evaluation-harness's
files (results_<date>.json and a samples_<task>_<date>.jsonl per task, in the directory PATH), and an
lm-evaluation-harness results file in as an external evaluation (apps/evals/external.py)."""

import json
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.http import Http404

from apps.accounts.selectors import project_for_command
from apps.evals import external, selectors, services


class Command(BaseCommand):
    help = "Export an evaluation's results (JSONL, lm-evaluation-harness) or import lm-evaluation-harness results."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        out = actions.add_parser("export", help="an evaluation's per-task results")
        out.add_argument("evaluation", type=int, help="the evaluation's number (the evals page's #)")
        out.add_argument("--format", choices=["jsonl", "lm-eval"], default="jsonl", dest="fmt")
        out.add_argument("--out", type=Path, help="jsonl: a file (default: standard output); lm-eval: a directory")
        out.add_argument("--project", help="project slug (default: the only project)")
        into = actions.add_parser("import", help="an lm-evaluation-harness results file as an external evaluation")
        into.add_argument("file", type=Path, help="results_<date>.json as lm-evaluation-harness wrote it")
        into.add_argument("--label", default="", help="the model's name on the leaderboard (default: the file's)")
        into.add_argument("--project", help="project slug (default: the only project)")

    def handle(self, *args, action, project, **options):
        try:
            scope = project_for_command(slug=project)
        except LookupError as exc:
            raise CommandError(str(exc))
        if action == "import":
            return self.load(scope, options["file"], options["label"])
        try:
            evaluation = selectors.evaluation_get(project=scope, pk=options["evaluation"])
        except Http404 as exc:
            raise CommandError(str(exc))
        fmt, out = options["fmt"], options["out"]
        if fmt == "lm-eval":
            if out is None:
                raise CommandError("--format lm-eval writes a directory: name it with --out")
            for path in external.write_lm_eval(evaluation, out):
                self.stdout.write(str(path))
            return
        lines = external.result_jsonl(evaluation)
        if out is None:
            sys.stdout.writelines(lines)
            return
        with open(out, "w", encoding="utf-8") as handle:
            handle.writelines(lines)
        self.stdout.write(str(out))

    def load(self, scope, file: Path, label: str):
        try:
            document = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise CommandError(f"{file}: cannot be read as JSON: {exc}")
        try:
            row = services.external_import(project=scope, document=document, label=label, actor=None, via="cli")
        except external.ResultsRefused as exc:
            raise CommandError(f"{file}: {exc}; nothing was imported")
        self.stdout.write(f"external evaluation {row.pk}: {row.label}, {len(row.scores)} tasks, key {row.key[:12]}")
