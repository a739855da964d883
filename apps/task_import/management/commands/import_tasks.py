"""`manage.py import_tasks --template SLUG --format FORMAT FILE`: tasks from a benchmark file become a new
version of the task template (all of them or none).

`--format swe-bench FILE --repos DIR`: repository tasks in SWE-bench's instance format, each repository at its base
in DIR/<instance_id>/ or DIR/<instance_id>.tar.gz. Each instance is validated in the template's sandbox image first
(gold patch 1, no patch 0; apps/task_import/swe_bench.py), its outcome printed with a reason (and what
verification left out of its gold patch); those that fail are refused, the others imported, and the command fails
if any was refused."""

import re
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.common import wiring
from apps.registry.errors import FieldError, SpecError, VersionNotFound
from apps.registry.pins import pinned_template
from apps.registry.refs import Ref
from apps.registry.selectors import instance_rows, version_resolve
from apps.registry.services import version_publish
from apps.task_import.swe_bench import SWE_BENCH, read_swe_bench, validate_repository_tasks, verifier_timeout
from apps.task_import.task_files import FORMATS, read_task_file


class Command(BaseCommand):
    help = "Import tasks from a JSONL file (gzip accepted) into a task template, as a new version."

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)
        parser.add_argument("--template", required=True, help="task template slug")
        parser.add_argument("--format", required=True, choices=sorted([*FORMATS, SWE_BENCH]))
        parser.add_argument("--repos", type=Path, help="swe-bench: the folder of repositories at their base "
                                                         "(<instance_id>/ or <instance_id>.tar.gz)")
        parser.add_argument("--concurrency", type=int, default=2, help="swe-bench: instances validated at once")
        parser.add_argument("--project", help="project slug (default: the only project)")
        parser.add_argument("--replace", action="store_true",
                            help="the file becomes the whole task set (default: add to the template's tasks)")
        parser.add_argument("--user", help="author of the new version")
        parser.add_argument("--message", default="")

    def handle(self, *args, file, template, format, project, replace, user, message, repos=None, concurrency=2,
               **_):
        try:
            scope = project_for_command(slug=project)
        except LookupError as exc:
            raise CommandError(str(exc))
        author = get_user_model().objects.filter(username=user).first() if user else None
        instances = None
        if format == SWE_BENCH and repos is None:
            raise CommandError("--format swe-bench needs --repos DIR (the repositories at their base)")
        refused = 0
        try:
            head = version_resolve(project=scope, ref=Ref("task_template", template))
            if format == SWE_BENCH:
                imported, refused = self.validated(read_swe_bench(file, repos), scope, template, concurrency)
            else:
                imported = read_task_file(file, format)
            instances = imported if replace else self.merged(head, imported)
            published = version_publish(project=scope, kind="task_template", slug=template, spec=head.spec,
                                        author=author, instances=instances, expected_head=head.number, via="cli",
                                        message=message or f"import {len(imported)} tasks from {file.name}")
        except (VersionNotFound, SpecError) as exc:
            problems = self.by_key(exc.errors, instances) if isinstance(exc, SpecError) else [exc]
            for problem in problems:
                self.stderr.write(f"  {problem}")
            raise CommandError(f"{len(problems)} problem(s); nothing was imported.")
        version = published.version
        if published.created:
            self.stdout.write(f"{version.ref}: {version.instance_set.count} tasks ({len(imported)} in the file).")
        else:
            self.stdout.write(f"{version.ref} already holds these tasks; nothing changed.")
        if refused:
            raise CommandError(f"{refused} instance(s) refused (their outcomes are above); the others were imported.")

    def validated(self, instances: list[dict], scope, template: str, concurrency: int) -> tuple[list[dict], int]:
        """The instances whose gold patch scores 1 and empty patch 0 in the template's image, and how many were
        refused; each outcome is printed as it comes."""
        pinned = pinned_template(project=scope, text=template)
        pool = wiring.sandbox_pool()
        try:
            validations = validate_repository_tasks(
                instances, pool=pool, image=pinned.image, timeout=verifier_timeout(pinned.verifier_version.spec),
                concurrency=concurrency,
                progress=lambda v: self.stdout.write(f"  {v.key}: {v.report}"))
        finally:
            pool.close()
        valid = [instance for instance, v in zip(instances, validations, strict=True) if v.ok]
        refused = len(instances) - len(valid)
        if not valid:
            raise SpecError([FieldError(v.key, f"{v.reason}: {v.detail[:500]}") for v in validations])
        return valid, refused

    def by_key(self, errors, instances) -> list[str]:
        """`instances[12].inputs: ...` from publishing, said as the task's key, which the user can find."""
        named = []
        for error in errors:
            match = re.match(r"instances\[(\d+)\](.*)", error.field)
            if match and instances and int(match[1]) < len(instances):
                named.append(f"task {instances[int(match[1])]['key']!r}{match[2]}: {error.problem}")
            else:
                named.append(str(error))
        return named

    def merged(self, head, imported: list[dict]) -> list[dict]:
        """The template's tasks plus the file's; a key that exists must come with the same task."""
        existing = {key: {"key": key, "inputs": inputs, "hidden": hidden}
                    for key, inputs, hidden in instance_rows(version=head)}
        clashes = [row["key"] for row in imported if row["key"] in existing and existing[row["key"]] != row]
        if clashes:
            raise SpecError([FieldError("key", f"{key!r} already exists with different content (use --replace)")
                             for key in clashes[:20]])
        existing.update({row["key"]: row for row in imported})
        return list(existing.values())
