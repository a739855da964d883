"""Generated task sets published from a generator library (`manage.py tasks from-generator reasoning-gym`): one
sandbox image and one verifier shared by all, then for each of the library's datasets a task template whose
instances the generator makes (TaskTemplateSpec.generator) and a domain tagged with the dataset's category (the
library's folder: algebra, arithmetic, games, ...), and a bundle of every domain published.

A dataset is published only after its reference check: every entry's own answer must score 1 and an empty answer 0,
through the real `generator_score` check in the image's sandbox (workers/verifiers/generated.py), all of one
dataset's answers in one sandbox execution. A dataset the library cannot make here (an error, a configuration it
needs, too slow), whose entries carry no reference answer, or whose scorer disagrees with its own answers is
refused with the reason; the others are published. Publishing is idempotent: a dataset whose template's newest
version already has the same spec (library version, seed, size, image and verifier versions) is left as it is,
without making or checking its tasks again; a new release of the library makes new versions.

`manage.py reference_check --bundle reasoning-gym` checks the published bundle the way it checks any bundle (as a
run whose trajectories are archived): its references are the same `<answer>...</answer>` responses
(workers/rl/models/base_model.py's reference_turns), graded by the same verifier.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata

from apps.accounts.models import Project
from apps.registry.models import Version
from apps.registry.services import version_publish
from workers.definitions.specs import SLUG_RE, validate_spec
from workers.rl.tasks.generators import (
    GeneratorError,
    LibraryDataset,
    installed_version,
    library_datasets,
    materialise_many,
)
from workers.sandbox import Execution, SandboxImage, Status
from workers.verifiers.generated import ANSWER_INSTRUCTION, answer_response, score_responses

LIBRARY = "reasoning-gym"
IMAGE_SLUG = "reasoning-gym"
VERIFIER_SLUG = "reasoning-gym-score"
SLUG_PREFIX = "rg-"  # template and domain slugs: rg-<dataset>, underscores as hyphens
DEFAULT_BUNDLE = "reasoning-gym"
SCORE_SECONDS = 10  # one answer's scoring (the generator_score check's timeout)
IMAGE_BUILD_SECONDS = 1800  # the image's first sandbox: pip installs the library into its layer
# Refused before anything is made: not a generator of its own.
NOT_GENERATORS = {"composite": "mixes other datasets, named in its config; their own domains are published instead"}
# The math stack a scorer leans on (sympy's parse_expr, numpy): the image pins the versions this host made the
# tasks with, beside the library itself.
SCORING_STACK = ("sympy", "numpy")


@dataclass
class DatasetOutcome:
    name: str
    category: str
    status: str  # published | unchanged | refused
    reason: str = ""
    template: str = ""  # the template version's ref
    domain: str = ""  # the domain version's ref
    tasks: int = 0
    seconds: float = 0.0  # making (if it was made here) and checking its tasks


@dataclass
class GeneratedReport:
    library: str
    version: str
    image: str
    verifier: str
    bundle: str = ""  # the bundle version's ref ("" when nothing was published)
    outcomes: list[DatasetOutcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def refused(self) -> list[DatasetOutcome]:
        return [o for o in self.outcomes if o.status == "refused"]

    @property
    def domains(self) -> list[DatasetOutcome]:
        return [o for o in self.outcomes if o.status != "refused"]


def image_spec(version: str) -> dict:
    packages = [f"{LIBRARY}=={version}"] + [f"{name}=={metadata.version(name)}" for name in SCORING_STACK]
    return {"layers": [{"type": "base", "image": "python-3.11-slim"},
                       {"type": "python_packages", "packages": packages}],
            # The library imports sympy, numpy and matplotlib: a warm sandbox holds about 150 MB before it scores.
            "limits": {"cpus": 1, "cpu_seconds": 30, "memory_mb": 1024, "wall_seconds": 60, "max_processes": 32,
                       "disk_mb": 256, "network": False},
            # A check is a fork of a warm sandbox and milliseconds of scoring; each sandbox's start imports the
            # library (seconds of CPU): two keep up with a CPU run's rollouts.
            "warm_pool_size": 2}


def verifier_spec() -> dict:
    return {"pass_threshold": 1.0, "layers": [{
        "name": "exact", "kind": "exact",
        "checks": [{"type": "generator_score", "name": "score_answer", "timeout_seconds": SCORE_SECONDS}]}]}


def template_slug(dataset: str) -> str:
    return SLUG_PREFIX + dataset.replace("_", "-")


def category_slug(category: str) -> str:
    slug = category.replace("_", "-").lower()
    return slug if re.fullmatch(SLUG_RE, slug) else ""


def template_spec(generator: dict, *, image: str, verifier: str, max_tokens: int) -> dict:
    # The instruction comes last: a model whose context is short keeps a prompt's tail (rollout/agent.py).
    return {"prompt_template": "{question}\n\n" + ANSWER_INSTRUCTION, "sandbox_image": image, "verifier": verifier,
            "limits": {"max_turns": 1, "max_tokens": max_tokens, "max_seconds": 60}, "generator": generator}


def publish_generated(*, project: Project, author, pool, library: str = LIBRARY, datasets: list[str] | None = None,
                      categories: list[str] | None = None, size: int = 50, seed: int = 0,
                      bundle: str = DEFAULT_BUNDLE, max_tokens: int = 1024,
                      say: Callable[[str], None] = lambda line: None) -> GeneratedReport:
    """Publish the library's datasets (all, or those named or of the categories named) as domains of `bundle`.
    Raises GeneratorError when the library is not installed here, ValueError for unknown names."""
    started = time.monotonic()
    if library != LIBRARY:
        raise GeneratorError(f"unknown generator library {library!r}; known: {LIBRARY}")
    version = installed_version(library)
    if version is None:
        raise GeneratorError(f"{library} is not installed on this host (pip install {library})")
    chosen = _chosen(library_datasets(library), datasets, categories)
    publish = _publisher(project=project, author=author, message=f"tasks from-generator {library} {version}")
    image_version = publish("sandbox_image", IMAGE_SLUG, image_spec(version),
                            f"Python 3.11 with {library} {version}: scores its datasets' answers; no network.")
    verifier_version = publish("verifier", VERIFIER_SLUG, verifier_spec(),
                               f"A generated task's own score ({library}'s score_answer), in the sandbox.")
    report = GeneratedReport(library, version, image_version.ref, verifier_version.ref)
    image = SandboxImage.from_spec(image_version.ref, image_version.spec)
    image_ref = f"{IMAGE_SLUG}@{image_version.number}"
    verifier_ref = f"{VERIFIER_SLUG}@{verifier_version.number}"
    say(f"{library} {version}: {len(chosen)} dataset(s), {size} tasks each from seed {seed}; image {image_ref}, "
        f"verifier {verifier_ref}")

    specs, to_make = {}, []
    newest = _newest_specs(project, [template_slug(d.name) for d in chosen])
    for dataset in chosen:
        generator = {"library": library, "version": version, "dataset": dataset.name, "config": {}, "seed": seed,
                     "size": size}
        specs[dataset.name] = template_spec(generator, image=image_ref, verifier=verifier_ref, max_tokens=max_tokens)
        if dataset.name in NOT_GENERATORS:
            report.outcomes.append(DatasetOutcome(dataset.name, dataset.category, "refused",
                                                  NOT_GENERATORS[dataset.name]))
        elif newest.get(template_slug(dataset.name)) == validate_spec("task_template", specs[dataset.name]):
            report.outcomes.append(DatasetOutcome(dataset.name, dataset.category, "unchanged"))
        else:
            to_make.append(dataset)
    if to_make:
        say(f"making the tasks of {len(to_make)} dataset(s) ...")
        made_started = time.monotonic()
        made = materialise_many([specs[d.name]["generator"] for d in to_make])
        say(f"  made in {time.monotonic() - made_started:.1f} s")
        _image_ready(pool, image, say)
    else:
        made = []
    for position, (dataset, instances) in enumerate(zip(to_make, made, strict=True), start=1):
        checked_started = time.monotonic()
        if isinstance(instances, GeneratorError):
            reason = str(instances)
        else:
            reason = reference_problem(pool, image, instances)
        outcome = DatasetOutcome(dataset.name, dataset.category, "refused" if reason else "published", reason,
                                 seconds=time.monotonic() - checked_started)
        report.outcomes.append(outcome)
        say(f"[{position}/{len(to_make)}] {dataset.name} ({dataset.category}): "
            + (f"refused: {reason}" if reason else f"reference check passed ({len(instances)} tasks, "
                                                  f"{outcome.seconds:.1f} s)"))

    members = []
    for outcome in sorted(report.outcomes, key=lambda o: o.name):
        if outcome.status == "refused":
            continue
        slug = template_slug(outcome.name)
        template = publish("task_template", slug, specs[outcome.name],
                           f"{library}'s {outcome.name} ({outcome.category}): {size} generated tasks from seed "
                           f"{seed}, scored by its own score_answer.")
        domain = publish("domain", slug, {"category": category_slug(outcome.category),
                                          "templates": [{"template": f"{slug}@{template.number}"}]},
                         f"{library}'s {outcome.name} ({outcome.category}).")
        outcome.template, outcome.domain = template.ref, domain.ref
        outcome.tasks = template.instance_set.count
        members.append(f"domain/{slug}@{domain.number}")
    if members:
        report.bundle = publish("bundle", bundle, {"members": members},
                                f"{library} {version}: {len(members)} generated domains, one per dataset.").ref
    report.seconds = time.monotonic() - started
    return report


def reference_problem(pool, image: SandboxImage, instances: list[dict]) -> str:
    """Why the dataset's own answers disagree with its scorer ("" when every entry's answer scores 1 and an empty
    answer 0, where its own answer is not empty), scored in one execution of the generator_score check's scorer."""
    unanswered = [item["key"] for item in instances if item["hidden"]["entry"].get("answer") is None]
    if unanswered:
        return (f"{len(unanswered)} of {len(instances)} entries carry no answer (first: {unanswered[0]}): its scorer "
                "judges an answer against the puzzle itself, so there is no reference to check it with")
    answers = [(answer_response(str(item["hidden"]["entry"]["answer"])), item["hidden"]) for item in instances]
    # Where an entry's own answer is empty (ab: a program that rewrites to nothing), the empty answer is the right
    # one: it is checked as the entry's answer, not as a wrong one.
    probed = [item for item in instances if str(item["hidden"]["entry"]["answer"]).strip()]
    if not probed:
        return "every entry's answer is empty: an empty answer cannot be told from a right one"
    empties = [(answer_response(""), item["hidden"]) for item in probed]
    outcomes = score_responses(pool, image, answers + empties, timeout_seconds=SCORE_SECONDS)
    ungraded = [o for o in outcomes if o.value is None]
    if ungraded:
        return f"the scorer could not be run: {ungraded[0].evidence}"
    for item, outcome in zip(instances, outcomes[:len(instances)], strict=True):
        if outcome.value != 1.0:
            return f"{item['key']}: its own answer scored {outcome.value:g} ({outcome.evidence})"
    for item, outcome in zip(probed, outcomes[len(instances):], strict=True):
        if outcome.value != 0.0:
            return f"{item['key']}: an empty answer scored {outcome.value:g}, not 0"
    return ""


def _chosen(known: list[LibraryDataset], names: list[str] | None, categories: list[str] | None) -> list[LibraryDataset]:
    by_name = {d.name: d for d in known}
    unknown = sorted(set(names or ()) - set(by_name))
    if unknown:
        raise ValueError(f"unknown dataset(s) {', '.join(unknown)}; known: {', '.join(sorted(by_name))}")
    folders = sorted({d.category for d in known})
    unknown = sorted(set(categories or ()) - set(folders))
    if unknown:
        raise ValueError(f"unknown categor(y/ies) {', '.join(unknown)}; known: {', '.join(folders)}")
    return [d for d in known if (not names or d.name in names) and (not categories or d.category in categories)]


def _newest_specs(project: Project, slugs: list[str]) -> dict[str, dict]:
    """The spec of each template's newest version, by slug (those published), in one query."""
    rows = (Version.objects.filter(definition__project=project, definition__kind="task_template",
                                   definition__slug__in=slugs)
            .order_by("definition__slug", "-number").values_list("definition__slug", "spec"))
    newest: dict[str, dict] = {}
    for slug, spec in rows:
        newest.setdefault(slug, spec)
    return newest


def _publisher(*, project: Project, author, message: str):
    def publish(kind: str, slug: str, spec: dict, description: str) -> Version:
        return version_publish(project=project, kind=kind, slug=slug, spec=spec, author=author, message=message,
                               description=description, via="cli").version
    return publish


def _image_ready(pool, image: SandboxImage, say) -> None:
    """The image's first sandbox, given the time pip takes to install the library into its layer (once per host:
    the layer is cached)."""
    say(f"starting {image.key}'s sandbox (the first time, pip installs {LIBRARY} into its layer) ...")
    result = pool.execute(image, Execution(program="import reasoning_gym"), timeout=IMAGE_BUILD_SECONDS)
    if result.status != Status.OK:
        raise GeneratorError(f"{image.key} cannot import {LIBRARY}: {result.reason} "
                             f"{result.stderr.decode('utf-8', 'replace')[-800:]}")
