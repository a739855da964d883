"""`manage.py verify --template SLUG[@N] --task-key KEY --response FILE` or `--batch FILE.jsonl`: Verdicts as JSON.
`manage.py verify --canaries VERIFIER[@N]`: the verifier version's score on each of its canaries (confirmed reward
hacks, apps/review/canaries.py), one JSON line each; exits 1 if it passes any of them.

The batch file has one `{"task_key": ..., "response": ...}` per line; verdicts come out one per line, in the
same order, while the samples are verified concurrently over one sandbox pool.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.common import wiring
from apps.registry.errors import VersionNotFound
from apps.registry.pins import pinned_template, task_item
from apps.registry.refs import Ref, split_slug_ref
from apps.registry.selectors import version_resolve
from workers.verifiers import Sample, verify


class Command(BaseCommand):
    help = "Verify responses to a task template's tasks and print each Verdict as JSON."

    def add_arguments(self, parser):
        parser.add_argument("--template", help="task template SLUG, SLUG@N or SLUG@alias")
        parser.add_argument("--canaries", metavar="VERIFIER",
                            help="check a verifier version (SLUG, SLUG@N, SLUG@alias) against its canaries")
        parser.add_argument("--project", help="project slug (default: the only project)")
        parser.add_argument("--task-key", help="the task instance to verify against")
        parser.add_argument("--response", type=Path, help="a file holding the response")
        parser.add_argument("--batch", type=Path, help="JSONL of {task_key, response}")
        parser.add_argument("--concurrency", type=int, default=2)
        parser.add_argument("--json", action="store_true", help="JSON output (the only output there is)")

    def handle(self, *args, template, canaries, project, task_key, response, batch, concurrency, **_):
        try:
            scope = project_for_command(slug=project)
        except LookupError as exc:
            raise CommandError(str(exc))
        if canaries:
            return self.check_canaries(scope, canaries)
        if not template:
            raise CommandError("give --template (with --task-key and --response, or --batch), or --canaries")
        if bool(batch) == bool(task_key and response):
            raise CommandError("give either --task-key with --response, or --batch")
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

    def check_canaries(self, scope, text: str) -> None:
        from apps.review.canaries import canaries_check

        try:
            version = version_resolve(project=scope, ref=Ref("verifier", *split_slug_ref(text)))
        except VersionNotFound as exc:
            raise CommandError(str(exc))
        results = canaries_check(version=version)
        for result in results:
            self.stdout.write(json.dumps({"verifier": version.ref, "canary": result.canary_id,
                                          "trajectory": str(result.canary.trajectory_id),
                                          "task_key": result.canary.task_key, "reward": result.reward,
                                          "status": result.status, "holds": result.holds,
                                          "evidence": result.evidence}))
        failing = [r for r in results if not r.holds]
        if failing:
            raise CommandError(f"{version.ref} passes {len(failing)} of its {len(results)} canaries (confirmed "
                               "reward hacks): it must score each 0")

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
