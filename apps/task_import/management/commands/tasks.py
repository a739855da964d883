"""`manage.py tasks from-repo PATH --out DIR`: bug-fix tasks from a Python repository and its tests.

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
"""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.common import wiring
from workers.rl.tasks.repository_mutations import (
    RepositoryRefused,
    instances_from_record,
    search_mutations,
    search_record,
)
from workers.sandbox import Limits, SandboxImage
from workers.verifiers.repository import (
    PYTEST_PIN,
    SnapshotError,
    archive_files,
    directory_files,
    snapshot_bytes,
)

# Where the search runs the tests: this machine's Python with pytest, the image repository tasks are verified in.
SEARCH_IMAGE = SandboxImage(key="builtin/python-pytest",
                            layers=({"type": "base", "image": "python-3.11"},
                                    {"type": "python_packages", "packages": [PYTEST_PIN]}),
                            limits=Limits(cpu_seconds=120, wall_seconds=180, memory_mb=1024, max_processes=64,
                                          disk_mb=256), warm_pool_size=2)


class Command(BaseCommand):
    help = "Make bug-fix repository tasks from a Python repository with tests (tasks from-repo PATH --out DIR)."

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

    def handle(self, *args, action, path, out, package, licence, count, max_tries, seed, timeout, **_):
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
