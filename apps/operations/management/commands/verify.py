"""`manage.py verify --template SLUG[@N] --task-key KEY --response FILE` or `--batch FILE.jsonl`: Verdicts as JSON.

The batch file has one `{"task_key": ..., "response": ...}` per line; verdicts come out one per line, in the
same order, while the samples are verified concurrently over one sandbox pool.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.registry.errors import VersionNotFound
from apps.runs import wiring
from apps.runs.pins import pinned_template, task_item
from workers.verifiers import Sample, verify


class Command(BaseCommand):
    help = "Verify responses to a task template's tasks and print each Verdict as JSON."

    def add_arguments(self, parser):
        parser.add_argument("--template", required=True, help="task template SLUG, SLUG@N or SLUG@alias")
        parser.add_argument("--project", help="project slug (default: the only project)")
        parser.add_argument("--task-key", help="the task instance to verify against")
        parser.add_argument("--response", type=Path, help="a file holding the response")
        parser.add_argument("--batch", type=Path, help="JSONL of {task_key, response}")
        parser.add_argument("--concurrency", type=int, default=2)
        parser.add_argument("--json", action="store_true", help="JSON output (the only output there is)")

    def handle(self, *args, template, project, task_key, response, batch, concurrency, **_):
        if bool(batch) == bool(task_key and response):
            raise CommandError("give either --task-key with --response, or --batch")
        try:
            scope = project_for_command(slug=project)
        except LookupError as exc:
            raise CommandError(str(exc))
        try:
            pinned = pinned_template(project=scope, text=template)
        except VersionNotFound as exc:
            raise CommandError(str(exc))
        requests = self.read_batch(batch) if batch else [(task_key, self.read_text(response))]
        try:
            items = [task_item(template=pinned.template, key=key) for key, _ in requests]
        except VersionNotFound as exc:
            raise CommandError(str(exc))
        pool = wiring.sandbox_pool()
        image = pinned.image
        pool.warm(image, max(1, min(concurrency, 8)))
        context = wiring.verification_context(pool=pool, image=image)
        try:
            with ThreadPoolExecutor(max_workers=max(1, concurrency)) as workers:
                verdicts = workers.map(lambda pair: verify(pinned.verifier_spec, Sample(response=pair[1][1]),
                                                           pair[0], context), zip(items, requests, strict=True))
                for (key, _), verdict in zip(requests, verdicts, strict=True):
                    line = {"task_key": key, "template": pinned.template.ref,
                            "verifier": pinned.verifier_version.ref, **verdict.to_json(),
                            "artifacts": {name: len(blob) for name, blob in verdict.artifacts.items()}}
                    self.stdout.write(json.dumps(line))
        finally:
            pool.close()

    def read_text(self, path: Path) -> str:
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {path}: {exc}")

    def read_batch(self, path: Path) -> list[tuple[str, str]]:
        requests, errors = [], []
        for number, line in enumerate(self.read_text(path).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                requests.append((str(row["task_key"]), str(row["response"])))
            except (ValueError, KeyError, TypeError) as exc:
                errors.append(f"line {number}: {type(exc).__name__}: {exc} (expected {{task_key, response}})")
        if errors:
            raise CommandError("; ".join(errors[:20]))
        return requests
