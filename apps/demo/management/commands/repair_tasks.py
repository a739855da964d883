"""`manage.py repair_tasks`: the repair domain's tasks (apps/demo/repair.py), searched once and recorded.

Each function of the demo's code tasks becomes a tiny repository (solution.py, visible and hidden pytest cases);
the mutation search runs its tests in the sandbox on the original (all must pass) and on mutations of solution.py,
in a seeded order, keeping up to --per-function mutations that a visible test catches. A family's record goes to
apps/demo/repair_tasks/<family>.json as soon as its functions are searched, so a run cut short keeps what it did;
--families searches only those again.

    manage.py repair_tasks                         # every family (about ten minutes on two cores)
    manage.py repair_tasks --families clamp,rotate
"""

import json
import time

from django.core.management.base import BaseCommand, CommandError

from apps.common import wiring
from apps.demo import repair
from workers.rl.tasks.repository_mutations import SEARCH_IMAGE, RepositoryRefused, search_mutations, search_record


class Command(BaseCommand):
    help = "Search mutations of the demo's functions that their visible tests catch; record them for the seed."

    def add_arguments(self, parser):
        parser.add_argument("--families", help="only these families (comma-separated; default: all)")
        parser.add_argument("--per-function", type=int, default=2, help="mutations kept per function at most")
        parser.add_argument("--max-tries", type=int, default=8, help="mutations tried per function at most")
        parser.add_argument("--seed", type=int, default=repair.SEED)
        parser.add_argument("--timeout", type=float, default=20, help="seconds for one run of a function's tests")

    def handle(self, *args, families, per_function, max_tries, seed, timeout, **options):
        by_family: dict[str, list] = {}
        for source, problem in repair.problems().values():
            by_family.setdefault(problem.family, []).append((source, problem))
        wanted = [name.strip() for name in families.split(",")] if families else sorted(by_family)
        unknown = [name for name in wanted if name not in by_family]
        if unknown:
            raise CommandError(f"no family {', '.join(unknown)}; the families are {', '.join(sorted(by_family))}")
        repair.RECORDS.mkdir(exist_ok=True)
        pool = wiring.sandbox_pool()
        started, kept, tried = time.monotonic(), 0, 0
        try:
            for number, family in enumerate(wanted, start=1):
                family_started, repositories = time.monotonic(), []
                for index, (source, problem) in enumerate(by_family[family], start=1):
                    self.stdout.write(f"[{number}/{len(wanted)}] {family} {index}/{len(by_family[family])} "
                                      f"{problem.key} ...", ending="\r")
                    try:
                        search = search_mutations(repair.repository_files(problem), pool=pool, image=SEARCH_IMAGE,
                                                  count=per_function, seed=seed, max_tries=max_tries,
                                                  max_failing_share=1.0, caught_by=repair.is_visible_test,
                                                  timeout=timeout)
                    except RepositoryRefused as exc:  # a canonical solution its own cases fail: a slip to fix
                        raise CommandError(f"{problem.key} ({source}): {exc}") from None
                    tried += search.tried
                    kept += len(search.kept)
                    if search.kept:
                        repositories.append(search_record(search, package=problem.key, source=f"{source}:{problem.key}",
                                                          hidden_tests=[repair.HIDDEN]))
                seconds = time.monotonic() - family_started
                found = sum(len(r["mutations"]) for r in repositories)
                (repair.RECORDS / f"{family}.json").write_text(json.dumps(
                    {"family": family, "seconds": round(seconds, 1), "repositories": repositories}, indent=1) + "\n")
                self.stdout.write(f"[{number}/{len(wanted)}] {family}: {found} task(s) from "
                                  f"{len(by_family[family])} function(s) in {seconds:.0f} s" + " " * 20)
        finally:
            pool.close()
        self.stdout.write(f"{kept} task(s) from {tried} mutation(s) tried in {time.monotonic() - started:.0f} s; "
                          f"records in {repair.RECORDS}")
