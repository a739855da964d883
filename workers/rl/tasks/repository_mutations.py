"""Bug-fix tasks from a real Python repository and its tests, as SWE-smith makes them: mutate the source, keep a
mutation only if some tests fail with it and all pass without it; the reverse diff is the gold patch.

- `mutation_candidates(files)`: every place in the non-test Python files where one of the operators below
  applies, found with `ast` and in a fixed order (file, position, operator), each applied as a textual edit of
  that node's source span, so the rest of the file keeps its formatting:
  flip_comparison (`<` to `>=`, `==` to `!=`, `in` to `not in`, ...), off_by_one (an integer constant n to
  n + 1 and a `+ 1`/`- 1` dropped), swap_arguments (a call's first two positional arguments), remove_branch (an
  `if` without `else` taken out, an `else` branch dropped), swap_boolean (`and` to `or`).
- `search_mutations(...)`: runs the repository's tests on the original once (every test must pass there, else
  the repository is refused), then on candidates (seeded order) until enough are kept: some tests fail, at most
  `max_failing_share` of them (a mutation that breaks the import of everything teaches little), some of them
  among the tests `caught_by` names when it is given (a repair task's visible tests: the ones its workspace runs),
  and a failing test's output becomes the problem statement's evidence.
- `mutation_instance(...)`: the repository task instance (workers/verifiers/repository.py's shape): the
  mutated repository as the snapshot, the gold patch, FAIL_TO_PASS and PASS_TO_PASS; the files named
  `hidden_tests` are left out of the snapshot and travel as the test patch (verification adds them, the
  workspace never holds them).
"""

from __future__ import annotations

import ast
import os
import random
import re
import stat
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

from workers.sandbox import Limits, SandboxImage, zygote
from workers.verifiers.repository import PYTEST_PIN, is_test_path, run_tests, snapshot_bytes, snapshot_files

OPERATORS = ("flip_comparison", "off_by_one", "swap_arguments", "remove_branch", "swap_boolean")
FLIPPED = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq,
           ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


@dataclass(frozen=True)
class Mutation:
    """One edit of one file: `old` (the node's source at lines `line`..`end_line`) becomes `new`."""

    path: str
    line: int
    column: int
    operator: str
    old: str
    new: str
    end_line: int = 0
    end_column: int = 0

    @property
    def key(self) -> str:
        stem = re.sub(r"[^a-z0-9]+", "-", self.path.removesuffix(".py").lower()).strip("-")
        return f"{stem}-l{self.line}c{self.column}-{self.operator.replace('_', '-')}"

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line))
        begin = starts[self.line - 1] + _char_offset(lines[self.line - 1], self.column)
        end = starts[self.end_line - 1] + _char_offset(lines[self.end_line - 1], self.end_column)
        if source[begin:end] != self.old:
            raise ValueError(f"{self.path}:{self.line}: the source there is not what the mutation expects")
        return source[:begin] + self.new + source[end:]


def _char_offset(line: str, byte_offset: int) -> int:
    """ast's col_offset counts UTF-8 bytes."""
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", "replace"))


def source_files(files: dict[str, bytes]) -> list[str]:
    return sorted(path for path in files if path.endswith(".py") and not is_test_path(path)
                  and path.split("/")[-1] not in ("setup.py", "conftest.py", "noxfile.py")
                  and not path.startswith(("docs/", "doc/", "examples/")))


def mutation_candidates(files: dict[str, bytes], *, checked: bool = True) -> list[Mutation]:
    """checked: only mutations whose file still parses afterwards (each one parses the file again: the search's
    cost, not a rebuild's, whose mutations were checked when they were found)."""
    found = []
    for path in source_files(files):
        try:
            source = files[path].decode("utf-8")
            tree = ast.parse(source)
        except (UnicodeDecodeError, SyntaxError):
            continue
        found.extend(m for m in _mutations_of(path, source, tree) if not checked or _still_parses(source, m))
    return found


def _segment(source: str, node: ast.AST) -> str | None:
    return ast.get_source_segment(source, node)


def _mutation(path: str, source: str, node: ast.AST, operator: str, new: str) -> Mutation | None:
    old = _segment(source, node)
    if old is None or old == new:
        return None
    return Mutation(path, node.lineno, node.col_offset, operator, old, new, node.end_lineno, node.end_col_offset)


def _mutations_of(path: str, source: str, tree: ast.AST) -> Iterator[Mutation]:
    for node in ast.walk(tree):
        made: list[Mutation | None] = []
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in FLIPPED:
            flipped = ast.Compare(left=node.left, ops=[FLIPPED[type(node.ops[0])]()], comparators=node.comparators)
            made.append(_mutation(path, source, node, "flip_comparison", ast.unparse(flipped)))
        elif isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 64:
            made.append(_mutation(path, source, node, "off_by_one", str(node.value + 1)))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub) \
                and isinstance(node.right, ast.Constant) and node.right.value == 1:
            made.append(_mutation(path, source, node, "off_by_one", _segment(source, node.left) or ""))
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and not any(
                isinstance(a, ast.Starred) for a in node.args[:2]):
            first, second = (_segment(source, a) for a in node.args[:2])
            if first and second and first != second:
                swapped = ast.Call(func=node.func, args=[node.args[1], node.args[0], *node.args[2:]],
                                   keywords=node.keywords)
                made.append(_mutation(path, source, node, "swap_arguments", ast.unparse(swapped)))
        elif isinstance(node, ast.If):
            if not node.orelse:
                made.append(_mutation(path, source, node, "remove_branch", "pass"))
            elif not (len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If)):  # a plain else
                kept = ast.If(test=node.test, body=node.body, orelse=[])
                made.append(_mutation(path, source, node, "remove_branch", ast.unparse(kept)))
        elif isinstance(node, ast.BoolOp):
            swapped = ast.BoolOp(op=ast.Or() if isinstance(node.op, ast.And) else ast.And(), values=node.values)
            made.append(_mutation(path, source, node, "swap_boolean", ast.unparse(swapped)))
        for mutation in made:
            if mutation is None or ("\n" in mutation.old and mutation.operator != "remove_branch"):
                continue  # a single line rewritten, or one branch taken out: never a whole statement reformatted
            yield mutation


def _still_parses(source: str, mutation: Mutation) -> bool:
    try:
        ast.parse(_reindented(mutation).apply(source))
    except (SyntaxError, ValueError):
        return False
    return True


def _reindented(mutation: Mutation) -> Mutation:
    """A multi-line replacement (ast.unparse writes it flush left) indented as the node's first line is."""
    if "\n" not in mutation.new:
        return mutation
    indent = " " * mutation.column
    new = mutation.new.replace("\n", "\n" + indent)
    return Mutation(mutation.path, mutation.line, mutation.column, mutation.operator, mutation.old, new,
                    mutation.end_line, mutation.end_column)


def mutated_files(files: dict[str, bytes], mutation: Mutation) -> dict[str, bytes]:
    changed = _reindented(mutation).apply(files[mutation.path].decode("utf-8"))
    return {**files, mutation.path: changed.encode("utf-8")}


# A regular file's mode, as a source file of the package has: the diff changes its text only.
_SOURCE_FILE = os.stat_result((stat.S_IFREG | 0o644, *(0,) * 9))


def file_diff(path: str, before: str, after: str) -> str:
    """A git-style diff of one file's text that `git apply` takes, written as a session's workspace diff is."""
    return zygote.file_diff(path, _SOURCE_FILE, _SOURCE_FILE, before.encode("utf-8"), after.encode("utf-8"))


# Where the search runs the tests: this machine's Python with pytest, the image repository tasks are verified in.
SEARCH_IMAGE = SandboxImage(key="builtin/python-pytest",
                            layers=({"type": "base", "image": "python-3.11"},
                                    {"type": "python_packages", "packages": [PYTEST_PIN]}),
                            limits=Limits(cpu_seconds=120, wall_seconds=180, memory_mb=1024, max_processes=64,
                                          disk_mb=256), warm_pool_size=2)


# --- the search ------------------------------------------------------------------------------------------------

@dataclass
class KeptMutation:
    mutation: Mutation
    fail_to_pass: list[str]
    evidence: str


@dataclass
class MutationSearch:
    tests: list[str]  # every test that passes on the original
    kept: list[KeptMutation] = field(default_factory=list)
    tried: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # why candidates were left out: no_failure, ...


class RepositoryRefused(ValueError):
    """The repository cannot give tasks as it stands (its tests do not all pass, or it has none)."""


def test_paths(files: dict[str, bytes]) -> list[str]:
    return sorted(path for path in files if path.endswith(".py") and is_test_path(path)
                  and path.split("/")[-1] not in ("__init__.py", "conftest.py"))


def search_mutations(files: dict[str, bytes], *, pool, image, count: int, seed: int = 0, max_tries: int = 60,
                     max_failing_share: float = 0.5, timeout: float = 120,
                     caught_by: Callable[[str], bool] | None = None,
                     progress: Callable[[int, int], None] | None = None) -> MutationSearch:
    """Up to `count` mutations of the repository's `files` that its tests catch (see the module's docstring).
    `caught_by(test_id)`: the tests of which one at least must fail (default: any of them)."""
    tests_files = test_paths(files)
    if not tests_files:
        raise RepositoryRefused("no test files (tests/, test_*.py, *_test.py) in the repository")
    original = run_tests(pool, image, archive=snapshot_bytes(snapshot_files(files)), diff="", test_patch="",
                         test_files=tests_files, timeout=timeout)
    if original.stage != "tests":
        raise RepositoryRefused(f"its tests could not run ({original.stage}): {original.detail[-1000:]}")
    failing = sorted(test for test, outcome in original.results.items() if outcome not in ("passed", "skipped"))
    if failing or not original.results:
        raise RepositoryRefused(f"{len(failing)} test(s) do not pass on the original: {', '.join(failing[:5])}"
                                if failing else f"pytest found no test: {original.detail[-1000:]}")
    tests = sorted(test for test, outcome in original.results.items() if outcome == "passed")
    search = MutationSearch(tests=tests)
    candidates = mutation_candidates(files)
    random.Random(seed).shuffle(candidates)
    touched: set[tuple[str, int]] = set()
    for mutation in candidates:
        if len(search.kept) >= count or search.tried >= max_tries:
            break
        if (mutation.path, mutation.line) in touched:
            continue  # one task per line of source: two mutations of one line make near-duplicate tasks
        search.tried += 1
        if progress is not None:
            progress(search.tried, len(search.kept))
        run = run_tests(pool, image, archive=snapshot_bytes(snapshot_files(mutated_files(files, mutation))),
                        diff="", test_patch="", test_files=tests_files, timeout=timeout)
        if run.stage != "tests":
            search.rejected[run.stage] = search.rejected.get(run.stage, 0) + 1
            continue
        broken = [test for test in tests if run.results.get(test) != "passed"]
        if not broken:
            search.rejected["no_failure"] = search.rejected.get("no_failure", 0) + 1
            continue
        if len(broken) > max_failing_share * len(tests):
            search.rejected["too_many_failures"] = search.rejected.get("too_many_failures", 0) + 1
            continue
        if caught_by is not None and not any(caught_by(test) for test in broken):
            search.rejected["not_caught_by"] = search.rejected.get("not_caught_by", 0) + 1
            continue
        touched.add((mutation.path, mutation.line))
        search.kept.append(KeptMutation(mutation, broken, _evidence(run.detail, broken)))
    return search


def _evidence(output: str, broken: list[str]) -> str:
    """The failing tests' part of pytest's output: from its FAILURES section on, cut to a readable size."""
    start = output.find("=== FAILURES ===")
    if start < 0:
        start = output.find("FAILURES")
    text = output[output.rfind("\n", 0, start) + 1:] if start >= 0 else output
    return text[:3000] + (f"\n[... {len(text) - 3000} more characters]" if len(text) > 3000 else "")


def problem_statement(package: str, kept: KeptMutation) -> str:
    shown = kept.fail_to_pass[:10]
    more = f" (and {len(kept.fail_to_pass) - 10} more)" if len(kept.fail_to_pass) > 10 else ""
    return (f"A change to {package} broke it: {len(kept.fail_to_pass)} of its tests now fail{more}.\n\n"
            + "\n".join(f"- {test}" for test in shown)
            + "\n\nFix the library's code (not its tests) so that they pass again. What pytest said:\n\n"
            + kept.evidence)


def mutation_instance(files: dict[str, bytes], kept: KeptMutation, *, package: str, tests: list[str],
                      hidden_tests: Collection[str] = ()) -> dict:
    mutation = kept.mutation
    broken = mutated_files(files, mutation)
    gold = file_diff(mutation.path, broken[mutation.path].decode("utf-8"), files[mutation.path].decode("utf-8"))
    test_patch = "".join(zygote.file_diff(path, None, _SOURCE_FILE, b"", files[path]) for path in sorted(hidden_tests))
    return {"key": f"{package}-{mutation.key}",
            "inputs": {"problem_statement": problem_statement(package, kept),
                       "repository": snapshot_files({path: content for path, content in broken.items()
                                                     if path not in hidden_tests})},
            "hidden": {"patch": gold, "test_patch": test_patch, "FAIL_TO_PASS": kept.fail_to_pass,
                       "PASS_TO_PASS": [test for test in tests if test not in set(kept.fail_to_pass)],
                       "mutation": {"path": mutation.path, "line": mutation.line, "column": mutation.column,
                                    "operator": mutation.operator}}}


# --- a search's record, to rebuild its instances from the same source without running anything ---------------

def search_record(search: MutationSearch, *, package: str, source: str, licence: str = "",
                  hidden_tests: Collection[str] = ()) -> dict:
    """hidden_tests: the test files its instances carry as their test patch (mutation_instance)."""
    return {"package": package, "source": source, "licence": licence, "tests": search.tests,
            **({"hidden_tests": sorted(hidden_tests)} if hidden_tests else {}),
            "mutations": [{"path": k.mutation.path, "line": k.mutation.line, "column": k.mutation.column,
                           "operator": k.mutation.operator, "fail_to_pass": k.fail_to_pass, "evidence": k.evidence}
                          for k in search.kept]}


def instances_from_record(files: dict[str, bytes], record: dict) -> list[dict]:
    """The instances a search found (search_record), rebuilt from the same source files; ValueError when the
    source is not the one searched (a mutation is not where the record says)."""
    candidates = {(m.path, m.line, m.column, m.operator): m for m in mutation_candidates(files, checked=False)}
    instances = []
    for entry in record["mutations"]:
        mutation = candidates.get((entry["path"], entry["line"], entry["column"], entry["operator"]))
        if mutation is None:
            raise ValueError(f"{entry['path']}:{entry['line']}: no {entry['operator']} mutation there; is this the "
                             f"source {record['source']} the record was made from?")
        kept = KeptMutation(mutation, list(entry["fail_to_pass"]), entry["evidence"])
        instance = mutation_instance(files, kept, package=record["package"], tests=record["tests"],
                                     hidden_tests=record.get("hidden_tests", ()))
        if record.get("licence"):
            instance["hidden"]["licence"] = record["licence"]
        instances.append(instance)
    return instances
