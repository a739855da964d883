"""`manage.py dataset_build SLUG --format sft|preference [--source JSON ...] [--upload PATH ...]
[--keep-eval-tasks] [--message TEXT] [--project SLUG]`: build a dataset's next version (apps/datasets/services.py)
and print its reference, rows and hash. A source is the spec's, as JSON, e.g.
`--source '{"type": "reference_check", "bundle": "demo-smollm", "tool_calls_only": true}'`."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.datasets.errors import DatasetError
from apps.datasets.services import dataset_build, dataset_upload
from workers.definitions.specs import DATASET_FORMATS


def _source(text: str) -> dict:
    try:
        source = json.loads(text)
    except ValueError as exc:
        raise CommandError(f"--source {text!r} is not JSON: {exc}") from None
    if not isinstance(source, dict):
        raise CommandError(f"--source {text!r}: write a JSON object with its type, e.g. "
                           '\'{"type": "review_pairs", "queue": "demo-check"}\'')
    return source


class Command(BaseCommand):
    help = "Build a dataset version from trajectories, review labels' pairs, a reference check and uploaded JSONL."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--format", choices=DATASET_FORMATS, default="sft", dest="fmt")
        parser.add_argument("--source", action="append", default=[], metavar="JSON", dest="sources",
                            help="a source of the dataset spec as JSON; repeatable, read in order")
        parser.add_argument("--upload", action="append", default=[], type=Path, metavar="PATH",
                            help="a JSONL file in TRL's chat-messages format, read after the sources; repeatable")
        parser.add_argument("--keep-eval-tasks", action="store_true",
                            help="keep rows answering an eval suite's tasks (left out by default)")
        parser.add_argument("--message", default="", help="why this version was built")
        parser.add_argument("--project", help="project slug (default: the only project)")

    def handle(self, *args, slug, fmt, sources, upload, keep_eval_tasks, message, project, **_):
        scope = project_for_command(slug=project)
        chosen = [_source(text) for text in sources]
        try:
            for path in upload:
                try:
                    content = path.read_bytes()
                except OSError as exc:
                    raise CommandError(f"--upload {path}: {exc.strerror}") from None
                chosen.append(dataset_upload(project=scope, name=path.name, content=content, fmt=fmt, actor=None,
                                             via="cli").source())
            if not chosen:
                raise CommandError("name at least one --source or --upload")
            built = dataset_build(project=scope, slug=slug, fmt=fmt, sources=chosen,
                                  exclude_eval_tasks=not keep_eval_tasks, message=message, actor=None, via="cli")
        except DatasetError as exc:
            raise CommandError(str(exc)) from None
        version = built.version
        left = ", ".join(f"{n} {cause}" for cause, n in version.spec["left_out"].items())
        self.stdout.write(f"{version.ref}{'' if built.created else ' (unchanged)'}: {version.spec['rows']} rows, "
                          f"sha256 {version.spec['content_sha256']}; left out: {left}")
