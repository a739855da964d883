"""`manage.py tasks from-repo PATH --out DIR`: bug-fix tasks from a Python repository and its tests.
`manage.py tasks from-generator reasoning-gym`: a domain per dataset of a generator library, published (below).

PATH is the repository: a folder, or an archive such as the package index's sdist (one top folder, taken off). Its
source is mutated (workers/rl/tasks/repository_mutations.py: flipped comparisons, off-by-one, swapped arguments,
removed branches, and/or swapped); a mutation is kept when some of its tests fail with it and all pass on the
original. DIR receives what `import_tasks --format swe-bench` reads, where each instance is validated again
before it is published:

    DIR/instances.jsonl          SWE-bench's instance format (the gold patch restores the original)
    DIR/repos/<instance_id>.tar.gz   each instance's repository, at its (mutated) base
    DIR/mutations.json           the search's record: rebuilds the same instances from the same source

    manage.py tasks from-repo inflection-0.5.1.tar.gz --out var/inflection-tasks --count 8
    manage.py import_tasks var/inflection-tasks/instances.jsonl --format swe-bench \
        --repos var/inflection-tasks/repos --template repository-bugfix

`from-generator LIBRARY [--datasets a,b] [--categories x,y] [--size N] [--seed S] [--project P] [--bundle SLUG]`
publishes the library's datasets (apps/task_import/generated.py): one sandbox image and verifier, a template and a
domain per dataset (its category the library's folder), a bundle of them all; each dataset's reference check first
(its own answers score 1, an empty answer 0, in the sandbox). It prints each dataset as it goes and a summary of
what was published and what was refused, and why; run again, it leaves what it published as it is.

    manage.py tasks from-generator reasoning-gym --size 20
    manage.py tasks from-generator reasoning-gym --categories arithmetic,algebra --bundle rg-maths
"""

import json
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.selectors import project_for_command
from apps.common import wiring
from apps.registry.errors import SpecError
from apps.task_import.generated import DEFAULT_BUNDLE, LIBRARY, GeneratedReport, publish_generated
from workers.definitions.specs import MAX_GENERATED_INSTANCES
from workers.rl.tasks.generators import GeneratorError
from workers.rl.tasks.repository_mutations import (
    SEARCH_IMAGE,
    RepositoryRefused,
    instances_from_record,
    search_mutations,
    search_record,
)
from workers.verifiers.repository import (
    SnapshotError,
    archive_files,
    directory_files,
    snapshot_bytes,
)


class Command(BaseCommand):
    help = ("Make bug-fix repository tasks from a Python repository with tests (tasks from-repo PATH --out DIR), or "
            "publish a generator library's datasets as domains (tasks from-generator reasoning-gym).")

    def add_arguments(self, parser):
        commands = parser.add_subparsers(dest="action", required=True)
        from_repo = commands.add_parser("from-repo", help="mutations of the repository that its tests catch")
        from_repo.add_argument("path", type=Path, help="a folder, or a .tar.gz such as an sdist")
        from_repo.add_argument("--out", type=Path, required=True, help="the folder to write the tasks to")
        from_repo.add_argument("--package", help="the name the tasks are keyed by (default: from PATH)")
        from_repo.add_argument("--licence", default="", help="the repository's licence, recorded in each task")
        from_repo.add_argument("--count", type=int, default=5, help="tasks to keep")
        from_repo.add_argument("--max-tries", type=int, default=40, help="mutations to try at most")
        from_repo.add_argument("--seed", type=int, default=0)
        from_repo.add_argument("--timeout", type=float, default=120, help="seconds for one run of the tests")
        generated = commands.add_parser("from-generator", help="a domain per dataset of a generator library")
        generated.add_argument("library", choices=[LIBRARY])
        generated.add_argument("--datasets", type=_names, help="only these datasets (comma-separated)")
        generated.add_argument("--categories", type=_names, help="only the datasets of these categories")
        generated.add_argument("--size", type=int, default=50, help="tasks per dataset (default 50)")
        generated.add_argument("--seed", type=int, default=0)
        generated.add_argument("--max-tokens", type=int, default=1024, help="what a rollout may sample (default 1024)")
        generated.add_argument("--project", help="project slug (default: the only project)")
        generated.add_argument("--bundle", default=DEFAULT_BUNDLE, help=f"the bundle's slug (default {DEFAULT_BUNDLE})")
        generated.add_argument("--user", help="author of the new versions")

    def handle(self, *args, action, **options):
        if action == "from-generator":
            return self.from_generator(**options)
        return self.from_repo(**options)

    def from_generator(self, *, library, datasets, categories, size, seed, max_tokens, project, bundle, user, **_):
        if not 1 <= size <= MAX_GENERATED_INSTANCES:
            raise CommandError(f"--size takes 1 to {MAX_GENERATED_INSTANCES:,}")
        try:
            scope = project_for_command(slug=project)
        except LookupError as exc:
            raise CommandError(str(exc))
        author = get_user_model().objects.filter(username=user).first() if user else None
        pool = wiring.sandbox_pool()
        try:
            report = publish_generated(project=scope, author=author, pool=pool, library=library, datasets=datasets,
                                       categories=categories, size=size, seed=seed, bundle=bundle,
                                       max_tokens=max_tokens, say=self.stdout.write)
        except (GeneratorError, SpecError, ValueError) as exc:
            raise CommandError(str(exc))
        finally:
            pool.close()
        self.summary(report)
        if not report.bundle:
            raise CommandError("no dataset was published")

    def summary(self, report: GeneratedReport) -> None:
        published = [o for o in report.domains if o.status == "published"]
        unchanged = [o for o in report.domains if o.status == "unchanged"]
        self.stdout.write(f"\n{report.library} {report.version}: {len(report.domains)} domain(s) in {report.bundle} "
                          f"({len(published)} published, {len(unchanged)} unchanged), {len(report.refused)} "
                          f"refused, in {report.seconds:.1f} s")
        for outcome in published:
            self.stdout.write(f"  published {outcome.name} ({outcome.category}): {outcome.template}, "
                              f"{outcome.domain}, {outcome.tasks} tasks")
        for outcome in report.refused:
            self.stdout.write(f"  refused {outcome.name} ({outcome.category}): {outcome.reason}")

    def from_repo(self, *, path, out, package, licence, count, max_tries, seed, timeout, **_):
        try:
            files = directory_files(path) if path.is_dir() else archive_files(path)
        except SnapshotError as exc:
            raise CommandError(str(exc))
        package = package or path.name.removesuffix(".tar.gz").removesuffix(".tgz").rsplit("-", 1)[0].lower()
        pool = wiring.sandbox_pool()
        try:
            search = search_mutations(files, pool=pool, image=SEARCH_IMAGE, count=count, seed=seed,
                                      max_tries=max_tries, timeout=timeout,
                                      progress=lambda tried, kept: self.stdout.write(
                                          f"  tried {tried}, kept {kept}", ending="\r"))
        except RepositoryRefused as exc:
            raise CommandError(f"{path.name}: {exc}")
        finally:
            pool.close()
        self.stdout.write("")
        if not search.kept:
            raise CommandError(f"none of {search.tried} mutations made a test fail (left out: {search.rejected})")
        record = search_record(search, package=package, source=path.name, licence=licence)
        instances = instances_from_record(files, record)
        (out / "repos").mkdir(parents=True, exist_ok=True)
        with open(out / "instances.jsonl", "w") as handle:
            for instance in instances:
                hidden = instance["hidden"]
                (out / "repos" / f"{instance['key']}.tar.gz").write_bytes(
                    snapshot_bytes(instance["inputs"]["repository"]))
                handle.write(json.dumps({"instance_id": instance["key"], "repo": package, "version": path.name,
                                         "problem_statement": instance["inputs"]["problem_statement"],
                                         "patch": hidden["patch"], "test_patch": hidden["test_patch"],
                                         "FAIL_TO_PASS": hidden["FAIL_TO_PASS"],
                                         "PASS_TO_PASS": hidden["PASS_TO_PASS"]}) + "\n")
        (out / "mutations.json").write_text(json.dumps(record, indent=1) + "\n")
        self.stdout.write(f"{len(instances)} task(s) from {search.tried} mutation(s) tried, {len(search.tests)} tests "
                          f"(left out: {search.rejected or 'none'}); written to {out}")
        for instance in instances:
            self.stdout.write(f"  {instance['key']}: {len(instance['hidden']['FAIL_TO_PASS'])} FAIL_TO_PASS")


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]
