"""Generated task sets: a task template's instances made by a procedural generator library (TaskTemplateSpec's
`generator`: library, version, dataset, config, seed, size) instead of uploaded.

Materialising runs the library in a process of its own, never in the studio's:
- the same instances on every host and in every process: the library's entries are made with the string hash
  fixed (PYTHONHASHSEED=0: eight of reasoning-gym 0.1.25's datasets make other tasks under another hash seed) and
  Python's and numpy's global random generators seeded with the spec's seed before each dataset (list_functions and
  codeio draw from them, and made other tasks in every process);
- the version installed must be the version the spec names, or nothing is made (GeneratorError names both): a
  new release of the library is a new version of the template, never a silent change of `@N`'s tasks;
- what the library prints and the memory it holds stay out of the studio's process (reasoning-gym imports sympy and
  matplotlib, and some datasets print while they generate), and a dataset that takes too long is stopped.

An instance is keyed `<dataset>-<seed>-<index>`; its inputs are what the prompt shows (`question`); its hidden part
is everything the library needs to score an answer to it (library, version, dataset, config and the entry itself as
JSON), which the `generator_score` check hands to the library's scorer in the sandbox (workers/verifiers/
generated.py). Values JSON cannot hold (a Fraction in gsm_symbolic's metadata) are written as their text; the
reference check at publish (apps/task_import/generated.py) scores every entry's own answer from that JSON, in the
sandbox, so an entry that no longer scores once written is found before anything trains on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata

from workers.definitions.canonical import canonical_json, data_problem

# The library's distribution name (what `pip` and importlib.metadata know it by) -> its import name.
LIBRARIES = {"reasoning-gym": "reasoning_gym"}
# A dataset's generation is stopped past this many seconds per instance (at least MIN_SECONDS in all).
SECONDS_PER_INSTANCE = 1.0
MIN_SECONDS = 60.0
# Materialised sets kept in this process, by their generator's canonical JSON: `tasks from-generator` materialises
# every dataset in one process of the library's (one import, not a hundred) before publishing them one by one.
CACHED_INSTANCES = 200_000
DRIVERS = max(1, min(4, os.cpu_count() or 1))  # runs of the library at once when many datasets are made

DRIVER = r'''
import contextlib, importlib, importlib.metadata, json, random, signal, sys, time, traceback

request = json.load(sys.stdin)
library = importlib.import_module(request["module"])
from reasoning_gym.factory import DATASETS

class TooLong(BaseException):  # not an Exception: a library's own `except Exception` cannot swallow it
    pass

def stop(signum, frame):
    raise TooLong()

signal.signal(signal.SIGALRM, stop)
result = {"version": importlib.metadata.version(request["library"]), "datasets": [], "made": []}
if request["op"] == "list":
    result["datasets"] = [{"name": name, "category": cls.__module__.split(".")[1], "module": cls.__module__}
                          for name, (cls, _) in sorted(DATASETS.items())]
for generator in request.get("generators", []):
    started = time.monotonic()
    try:
        random.seed(generator["seed"])
        try:
            import numpy
            numpy.random.seed(generator["seed"])
        except ImportError:
            pass
        signal.alarm(max(1, int(generator["seconds"])))
        # What the library prints while it generates goes to stderr: stdout is not read, but nor is it the place.
        with contextlib.redirect_stdout(sys.stderr):
            dataset = library.create_dataset(generator["dataset"], **generator["config"], seed=generator["seed"],
                                             size=generator["size"])
            entries = [dataset[index] for index in range(generator["size"])]
        signal.alarm(0)
        made = {"entries": json.loads(json.dumps(entries, default=str, allow_nan=False))}
    except TooLong:
        made = {"error": f"took longer than {generator['seconds']:g} s to make {generator['size']} instances"}
    except Exception as exc:
        signal.alarm(0)
        made = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
    made["seconds"] = round(time.monotonic() - started, 3)
    result["made"].append(made)
with open(request["out"], "w") as out:
    json.dump(result, out)
'''


class GeneratorError(ValueError):
    """A generator that cannot be materialised here, in words: another installed version, an unknown dataset, a
    configuration the library refuses, a dataset that takes too long."""


@dataclass(frozen=True)
class LibraryDataset:
    name: str
    category: str  # the library's folder of the dataset (reasoning-gym: algebra, arithmetic, games, ...)


def installed_version(library: str) -> str | None:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return None


def check_version(generator: dict) -> None:
    """Refuses a generator whose library is not installed at exactly the version it names."""
    library, wanted = generator["library"], generator["version"]
    if library not in LIBRARIES:
        raise GeneratorError(f"unknown generator library {library!r}; known: {', '.join(sorted(LIBRARIES))}")
    found = installed_version(library)
    if found is None:
        raise GeneratorError(f"{library} {wanted} made these instances, and {library} is not installed on this host "
                             f"(pip install {library}=={wanted})")
    if found != wanted:
        raise GeneratorError(f"{library} {wanted} made these instances, but this host has {library} {found}: "
                             f"{found} may make other tasks from the same seed. Install {library}=={wanted}, or "
                             f"publish a new version with version {found}")


def library_datasets(library: str) -> list[LibraryDataset]:
    """Every dataset the installed library registers, with its category, by name."""
    if library not in LIBRARIES:
        raise GeneratorError(f"unknown generator library {library!r}; known: {', '.join(sorted(LIBRARIES))}")
    if installed_version(library) is None:
        raise GeneratorError(f"{library} is not installed on this host")
    result = _run_driver({"op": "list", "library": library, "module": LIBRARIES[library]}, timeout=300)
    return [LibraryDataset(d["name"], d["category"]) for d in result["datasets"]]


def instance_key(generator: dict, index: int) -> str:
    return f"{generator['dataset']}-{generator['seed']}-{index}"


def materialise(generator: dict) -> list[dict]:
    """The template's instances ({key, inputs, hidden}) from its generator spec (the normalised `generator` of a
    TaskTemplateSpec); GeneratorError if they cannot be made here. The list is shared: do not change it."""
    (made,) = materialise_many([generator])
    if isinstance(made, GeneratorError):
        raise made
    return made


def materialise_many(generators: list[dict]) -> list[list[dict] | GeneratorError]:
    """Each generator's instances, or the GeneratorError that says why not; the ones not made before in this
    process are made in one run of the library, one after the other."""
    results: list[list[dict] | GeneratorError | None] = []
    missing: dict[str, list[int]] = {}
    for position, generator in enumerate(generators):
        try:
            check_version(generator)
        except GeneratorError as exc:
            results.append(exc)
            continue
        cached = _CACHE.get(canonical_json(generator))
        results.append(cached)
        if cached is None:
            missing.setdefault(generator["library"], []).append(position)
    for library, positions in missing.items():
        # A run of the library per core, each given every n-th dataset: a dataset's instances do not depend on the
        # datasets made before it in the same process (each alone and all in one run make the same).
        shares = [positions[start::DRIVERS] for start in range(min(DRIVERS, len(positions)))]
        with ThreadPoolExecutor(max_workers=len(shares), thread_name_prefix="generator") as threads:
            runs = list(threads.map(_materialise_run, [library] * len(shares),
                                    [[generators[position] for position in share] for share in shares]))
        for share, made in zip(shares, runs, strict=True):
            for position, outcome in zip(share, made, strict=True):
                results[position] = _instances(generators[position], outcome)
                if isinstance(results[position], list):
                    _CACHE.put(canonical_json(generators[position]), results[position])
    return results


def _materialise_run(library: str, wanted: list[dict]) -> list[dict]:
    """The driver's outcome for each generator of `wanted`, made one after the other in one run of the library."""
    budgets = [max(MIN_SECONDS, SECONDS_PER_INSTANCE * g["size"]) for g in wanted]
    made = _run_driver({"op": "materialise", "library": library, "module": LIBRARIES[library],
                        "generators": [{**g, "seconds": seconds} for g, seconds in zip(wanted, budgets, strict=True)]},
                       timeout=sum(budgets) + 300)
    if made["version"] != installed_version(library):  # installed while this process ran: say so, never mix
        raise GeneratorError(f"{library} {made['version']} ran, but this process found {library} "
                             f"{installed_version(library)} installed; run again")
    return made["made"]


def _instances(generator: dict, outcome: dict) -> list[dict] | GeneratorError:
    name = f"{generator['library']} {generator['dataset']}"
    if "error" in outcome:
        return GeneratorError(f"{name}: {outcome['error']}")
    hidden_base = {"library": generator["library"], "version": generator["version"], "dataset": generator["dataset"],
                   "config": generator["config"]}
    instances = []
    for index, entry in enumerate(outcome["entries"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("question"), str):
            return GeneratorError(f"{name}: entry {index} has no question text")
        item = {"key": instance_key(generator, index), "inputs": {"question": entry["question"]},
                "hidden": {**hidden_base, "entry": entry}}
        problem = data_problem(item, where=f"entry {index}")
        if problem:
            return GeneratorError(f"{name}: {problem}")
        instances.append(item)
    return instances


def _run_driver(request: dict, *, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="generator-") as folder:
        out = os.path.join(folder, "result.json")
        # PYTHONHASHSEED is read when the interpreter starts: the one way to fix a set's order of strings.
        environment = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps({**request, "out": out}),
                                  capture_output=True, text=True, timeout=timeout, env=environment)
        except subprocess.TimeoutExpired:
            raise GeneratorError(f"{request['library']} did not finish in {timeout:.0f} s")
        if done.returncode != 0 or not os.path.exists(out):
            raise GeneratorError(f"{request['library']} failed (exit status {done.returncode}): "
                                 f"{done.stderr[-1500:]}")
        with open(out) as handle:
            return json.load(handle)


class _InstanceCache:
    """Materialised instance lists by generator, the oldest let go past CACHED_INSTANCES instances in all."""

    def __init__(self, limit: int):
        self.limit = limit
        self._sets: OrderedDict[str, list[dict]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> list[dict] | None:
        with self._lock:
            found = self._sets.get(key)
            if found is not None:
                self._sets.move_to_end(key)
            return found

    def put(self, key: str, instances: list[dict]) -> None:
        with self._lock:
            self._sets[key] = instances
            self._sets.move_to_end(key)
            while len(self._sets) > 1 and sum(len(v) for v in self._sets.values()) > self.limit:
                self._sets.popitem(last=False)


_CACHE = _InstanceCache(CACHED_INSTANCES)
