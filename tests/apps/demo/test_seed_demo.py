"""The demo seed: what it publishes, that a second run publishes nothing, and that its generated tasks are sound."""

import random
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from apps.accounts.models import AuditEvent, Project
from apps.demo import arithmetic, coding, docqa, modelling3d, smollm
from apps.evals.suites import suite_settings
from apps.registry.models import Definition, InstanceSet, InstanceSetMember, TaskInstance, Version
from apps.registry.pins import bundle_tasks
from apps.registry.refs import Ref
from apps.registry.selectors import version_resolve
from apps.runs.management.commands.train import parse_setting
from workers.definitions.specs import parse_spec, prompt_placeholders
from workers.rl.config import GRPOConfig
from workers.rl.models.packaged import SMOLLM2_135M, file_sha256, gguf_file
from workers.rl.rollout.evaluation import suite_tasks
from workers.rl.tasks.overlap import overlap
from workers.verifiers import Item, verify
from workers.verifiers.types import Sample

DOMAINS = {
    "arithmetic": {"add-two"},
    "word-problems": {"multi-step"},
    "python-coding": {"python-functions"},
    "document-qa": {"cite-figures"},
    "3d-modelling": {"primitive-solids"},
}
# The real-model demo's bundle (apps/demo/smollm.py), on the same images and verifiers.
# The repository tasks' bundle (apps/demo/repositories.py): one domain, one template, its own image and verifier.
REPOSITORY_DOMAINS = {"python-repositories": {"repository-bugfix"}}
# The repair loop's bundle for SmolLM2 (apps/demo/repair.py), on the repository tasks' image and verifier; its eval
# suite (repair-suite) pins the held-out twin.
REPAIR_DOMAINS = {"python-repair": {"function-repair"}}
SMOLLM_DOMAINS = {"smol-sums": {"smol-sum"}, "smol-python": {"smol-functions"}, "smol-tools": {"smol-run-python"}}


@pytest.fixture
def seeded(db):
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return Project.objects.get(slug="demo"), out.getvalue()


def latest(project, kind, slug):
    return version_resolve(project=project, ref=Ref(kind, slug))


def stored_instances(version) -> list[TaskInstance]:
    return [m.instance for m in InstanceSetMember.objects.filter(instance_set=version.instance_set)
            .select_related("instance").order_by("key")]


def test_seed_publishes_five_domains_with_hundreds_of_instances_per_template(seeded):
    project, output = seeded
    for domain, templates in DOMAINS.items():
        spec = latest(project, "domain", domain).spec
        assert {draw["template"] for draw in spec["templates"]} == templates
        for slug in templates:
            version = latest(project, "task_template", slug)
            stored = InstanceSetMember.objects.filter(instance_set=version.instance_set).count()
            held_out = latest(project, "task_template", f"{slug}-held-out").instance_set.count
            assert stored == version.instance_set.count and stored + held_out >= 200, slug
            needed = prompt_placeholders(version.spec["prompt_template"])
            first = stored_instances(version)[0]
            assert needed <= set(first.inputs), slug
    assert "http://127.0.0.1:8000/" in output and "demo / password demo" in output
    roles = {m.user.username: m.role for m in project.memberships.select_related("user")}
    assert roles == {"demo": "owner", "reviewer": "reviewer"}  # a second reviewer, for agreement
    assert project.memberships.get(role="owner").user.check_password("demo")
    rubric = latest(project, "rubric", "trajectory-review").spec
    assert "reward-hack" in rubric["questions"][0]["labels"]


def test_bundle_pins_every_definition_the_domains_need(seeded):
    """The bundles pin, between them, every definition the seed publishes (the eval suite its held-out twins); each
    training bundle pins its domains' closure and the base model its run settings name."""
    project, _ = seeded
    everything = {v.ref: v.content_hash for v in Version.objects.filter(definition__project=project)
                  .exclude(definition__kind__in=["bundle", "rubric"]).select_related("definition")}
    pinned = {member["ref"]: member["content_hash"] for suite in ("demo-suite", "repair-suite")
              for member in latest(project, "bundle", suite).spec["resolved"]}
    for slug, domains, model in (("demo", DOMAINS, "demo-tiny"), ("demo-smollm", SMOLLM_DOMAINS,
                                                                   "smollm2-135m-instruct"),
                                 ("demo-repositories", REPOSITORY_DOMAINS, "demo-tiny"),
                                 ("demo-repair-smollm", REPAIR_DOMAINS, "smollm2-135m-instruct")):
        bundle = latest(project, "bundle", slug)
        resolved = {member["ref"]: member["content_hash"] for member in bundle.spec["resolved"]}
        assert bundle.spec["members"] == [f"domain/{domain}@1" for domain in domains]
        assert {ref.split("/")[0] for ref in resolved} == {"domain", "task_template", "sandbox_image", "verifier",
                                                           "model"}
        assert bundle.spec["run_config"]["model"] == f"model/{model}@1" and f"model/{model}@1" in resolved
        assert {ref for ref in resolved if ref.startswith("task_template/")} == {
            f"task_template/{template}@1" for templates in domains.values() for template in templates}
        pinned.update(resolved)
    assert pinned == everything


def test_the_real_model_bundle_carries_the_settings_it_is_sized_for(seeded):
    project, _ = seeded
    run_config = latest(project, "bundle", "demo-smollm").spec["run_config"]
    assert run_config["model"] == "model/smollm2-135m-instruct@1" and run_config["engine"] == "transformers"
    assert run_config["lora_rank"] > 0
    model = latest(project, "model", "smollm2-135m-instruct").spec
    assert model["source"] == {"type": "package", "name": "smollm2-135m-instruct"}
    assert model["weights_sha256"] == file_sha256(gguf_file(SMOLLM2_135M)) and model["licence"] == "Apache-2.0"
    # The tiny model's settings are the defaults; its weights come from the tasks, so no hash is pinned.
    assert latest(project, "bundle", "demo").spec["run_config"] == {
        "model": "model/demo-tiny@1", "eval_suite": "demo-suite", "eval_suite_every": 100}
    suite = latest(project, "bundle", "demo-suite").spec
    assert suite["evaluation"] == {"samples_per_task": 1, "temperature": 0.0, "tasks_per_template": 10, "seed": 7}
    assert suite["members"] == [f"domain/{domain}-held-out@1" for domain in DOMAINS]
    assert latest(project, "model", "demo-tiny").spec["weights_sha256"] == ""


def test_the_demo_suite_asks_only_tasks_the_demo_run_never_trains_on(seeded):
    """Each template of the demo bundle holds out instances for the suite: the overlap check, as it runs on a
    checkpoint's evaluation, finds none of the suite's tasks in the bundle, neither the same instance nor a prompt
    sharing a 13-word sequence, so the leaderboard's cells are clean scores."""
    project, _ = seeded
    bundle, suite = latest(project, "bundle", "demo"), latest(project, "bundle", "demo-suite")
    settings = suite_settings(suite)
    asked = suite_tasks(bundle_tasks(bundle=suite), per_template=settings["tasks_per_template"],
                        seed=settings["seed"])
    assert len(asked) == 10 * len(DOMAINS)
    assert {task.domain for task in asked} == {f"{domain}-held-out" for domain in DOMAINS}
    assert overlap(asked, bundle_tasks(bundle=bundle, config=GRPOConfig.resolve(bundle.spec["run_config"]))) == {
        "exact": [], "near": []}
    for templates in DOMAINS.values():  # the held-out instances left the training templates
        for slug in templates:
            training = {m.instance.content_hash for m in InstanceSetMember.objects.filter(
                instance_set=latest(project, "task_template", slug).instance_set).select_related("instance")}
            held_out = stored_instances(latest(project, "task_template", f"{slug}-held-out"))
            assert len(held_out) >= 10 and not training & {instance.content_hash for instance in held_out}


def test_second_run_creates_no_versions_instances_or_audit_rows(seeded):
    tables = [Definition, Version, InstanceSet, InstanceSetMember, TaskInstance, AuditEvent]
    before = {table.__name__: table.objects.count() for table in tables}
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert {table.__name__: table.objects.count() for table in tables} == before
    assert "0 new version(s)" in out.getvalue() and "created" not in out.getvalue()


def test_citation_spans_occur_verbatim_in_the_mounted_reports(seeded):
    project, _ = seeded
    files = next(layer["files"] for layer in latest(project, "sandbox_image", "docqa-corpus").spec["layers"]
                 if layer["type"] == "files")
    checked = 0
    for instance in stored_instances(latest(project, "task_template", "cite-figures")):
        citations = instance.hidden["citations"]
        assert [c["doc_id"] for c in citations] == instance.inputs["doc_ids"]
        for citation in citations:
            report = files[f"docs/{citation['doc_id']}.txt"]
            assert citation["span"] in report, instance.key
            checked += 1
        if len(citations) == 1:  # a single-report answer is stated in its span, as written there
            answer = instance.hidden["answer"]
            written = f"{int(answer):,}" if answer.isdigit() else answer
            assert written in citations[0]["span"], instance.key
    assert checked >= 200


def test_answer_text_and_value_agree():
    """The verifier reads the answer text ("12.4 million", "15%"); analytics read the value. They must agree."""
    scale = {" million": 1e6, "%": 1}
    items = docqa.instances(docqa.corpus())
    for item in items:
        answer, value = item["hidden"]["answer"], item["hidden"]["value"]
        suffix = next((s for s in scale if answer.endswith(s)), "")
        parsed = float(answer.removesuffix(suffix)) * scale.get(suffix, 1)
        assert parsed == pytest.approx(value, rel=1e-9), item["key"]
    assert {item["hidden"]["unit"] for item in items} >= {"USD", "percent", "people"}


def test_add_two_covers_every_pair_below_thirty():
    items = arithmetic.add_two_instances()
    assert len(items) == 900
    assert {(i["inputs"]["a"], i["inputs"]["b"]) for i in items} == {(a, b) for a in range(30) for b in range(30)}
    assert all(i["hidden"]["answer"] == i["inputs"]["a"] + i["inputs"]["b"] for i in items)


def test_word_problem_working_ends_in_the_answer():
    items = arithmetic.multi_step_instances()
    assert len(items) >= 300 and len({i["inputs"]["question"] for i in items}) == len(items)
    for item in items:
        steps = item["hidden"]["working"].split(";")
        assert int(re.findall(r"-?\d+", steps[-1])[-1]) == item["hidden"]["answer"], item["key"]
        for step in steps:  # each step is true arithmetic
            lhs, rhs = step.rsplit("=", 1)
            if not lhs.strip().startswith("+"):
                assert eval(lhs) == int(rhs), item["key"]  # only digits and operators we generated


def test_solid_references_are_consistent():
    items = modelling3d.instances()
    assert len(items) >= 200
    assert {i["inputs"]["shape"] for i in items} == {"box", "cylinder", "sphere", "l-bracket", "plate-with-hole"}
    for item in items:
        (x0, y0, z0), (x1, y1, z1) = item["hidden"]["bounds"]
        assert item["hidden"]["extents"] == [x1 - x0, y1 - y0, z1 - z0]
        # a solid fills part of its bounding box: more than nothing, never more than all of it
        assert 0 < item["hidden"]["volume"] <= (x1 - x0) * (y1 - y0) * (z1 - z0) + 1e-6, item["key"]


def _run_unittest(workdir: Path, **files: str) -> subprocess.CompletedProcess:
    """Writes files (solution.py, test_solution.py, ...) to workdir and runs the tests as the verifier would."""
    workdir.mkdir()
    for name, text in files.items():
        (workdir / f"{name}.py").write_text(text)
    return subprocess.run([sys.executable, "-m", "unittest", "-v", "test_solution"], cwd=workdir,
                          capture_output=True, text=True, timeout=60)


def _sample_across_families(items: list[dict], per_family: int, rng: random.Random) -> list[dict]:
    by_family = defaultdict(list)
    for item in items:
        by_family[item["inputs"]["family"]].append(item)
    return [item for family in sorted(by_family)
            for item in rng.sample(by_family[family], min(per_family, len(by_family[family])))]


def test_canonical_solutions_pass_their_hidden_tests(tmp_path):
    items = coding.instances()
    assert len(items) >= 200
    sample = _sample_across_families(items, per_family=2, rng=random.Random(7))
    assert len(sample) >= 30 and len({i["inputs"]["family"] for i in sample}) == len(coding.FAMILIES)
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: _run_unittest(tmp_path / i["key"], solution=i["hidden"]["canonical_solution"],
                                                        test_solution=i["hidden"]["tests"]), sample))
    for item, result in zip(sample, results, strict=True):
        assert result.returncode == 0, f"{item['key']}:\n{result.stderr}"
        assert "Ran 2 tests" in result.stderr and "OK" in result.stderr


def test_the_real_model_demo_one_liners_pass_their_hidden_tests_and_returning_none_fails(tmp_path):
    items = smollm.python_instances()
    sample = _sample_across_families(items, per_family=2, rng=random.Random(9))
    runs = [(i, "canonical", i["hidden"]["canonical_solution"]) for i in sample]
    runs += [(i, "none", f"def {i['hidden']['entry_point']}(*args):\n    return None\n") for i in sample]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda run: _run_unittest(
            tmp_path / f"{run[1]}-{run[0]['key']}", solution=run[2], test_solution=run[0]["hidden"]["tests"]), runs))
    for (item, how, _), result in zip(runs, results, strict=True):
        assert (result.returncode == 0) == (how == "canonical"), f"{item['key']} ({how}):\n{result.stderr}"


WRONG_SOLUTIONS = {
    "returns-none": "def {name}(*args):\n    return None\n",
    # The right answer, but the caller's list is emptied afterwards: the tests also check arguments are left alone.
    "mutates-input": "from reference import {name} as right\n\n\ndef {name}(*args):\n    result = right(*args)\n"
                     "    for a in args:\n        if isinstance(a, list):\n            a.clear()\n    return result\n",
}


def test_wrong_solutions_fail_the_hidden_tests(tmp_path):
    sample = _sample_across_families(coding.instances(), per_family=1, rng=random.Random(8))
    takes_list = [i for i in sample if "list[" in i["inputs"]["signature"].split("->")[0]]
    assert takes_list
    runs = [(i, "returns-none") for i in sample] + [(i, "mutates-input") for i in takes_list]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda run: _run_unittest(
            tmp_path / f"{run[1]}-{run[0]['key']}",
            solution=WRONG_SOLUTIONS[run[1]].format(name=run[0]["hidden"]["entry_point"]),
            reference=run[0]["hidden"]["canonical_solution"], test_solution=run[0]["hidden"]["tests"]), runs))
    for (item, how), result in zip(runs, results, strict=True):
        assert result.returncode != 0, f"{how} passed the tests of {item['key']}"
        assert "FAIL" in result.stderr


def test_reference_scripts_build_the_reference_solids(tmp_path):
    """The reference scripts as the cad-3d image runs them (trimesh and manifold3d, pinned in pyproject.toml)."""
    import trimesh
    items = modelling3d.instances()
    for shape in ("box", "cylinder", "sphere", "l-bracket", "plate-with-hole"):
        item = next(i for i in items if i["inputs"]["shape"] == shape)
        workdir = tmp_path / shape
        workdir.mkdir()
        (workdir / "reference.py").write_text(item["hidden"]["reference_script"])
        subprocess.run([sys.executable, "reference.py"], cwd=workdir, check=True, timeout=120)
        mesh = trimesh.load(workdir / "out.stl")
        assert mesh.is_watertight
        assert abs(mesh.volume - item["hidden"]["volume"]) / item["hidden"]["volume"] < 0.005
        assert abs(mesh.bounds - item["hidden"]["bounds"]).max() < 0.01


def test_the_real_model_demo_reads_the_number_and_evaluates_nothing(seeded):
    """What SmolLM2 learned under numeric-exact: restating the question, which its math layer evaluates."""
    project, _ = seeded
    item = Item(key="sum-19-14", inputs={"a": 19, "b": 14}, hidden={"answer": 33})

    def reward(verifier: str, response: str) -> float:
        spec = parse_spec("verifier", latest(project, "verifier", verifier).spec)
        return verify(spec, Sample(response=response, logs="", trajectory_id="t"), item, None).reward

    restated = "To solve 19+14, we"
    assert reward("numeric-exact", restated) == 1.0
    assert reward("number-only", restated) == 0.0
    assert reward("number-only", "19 + 14 = 33") == reward("number-only", "33") == 1.0
    assert reward("number-only", "19 + 14 = 32") == 0.0
    for template in ("smol-sum", "smol-run-python"):
        assert latest(project, "task_template", template).spec["verifier"] == "number-only"


def test_the_real_model_demos_grpo_stage_settings_resolve_and_weight_the_bundles_own_domains():
    """`make demo MODEL=smollm` trains its GRPO stage after the cold start with settings of its own (Makefile,
    AFTER_COLD_START): each must be one the run accepts on top of the bundle's run_config, and its mix must name
    exactly the bundle's domains — a renamed domain or setting would make the run refuse them."""
    makefile = (Path(__file__).resolve().parents[3] / "Makefile").read_text()
    line = re.search(r"^AFTER_COLD_START := (.*?)(?<!\\)$", makefile, re.S | re.M).group(1).replace("\\\n", " ")
    words = shlex.split(line)
    settings = dict(parse_setting(value) for flag, value in zip(words[::2], words[1::2], strict=True)
                    if flag == "--set")
    assert settings.pop("model") == "checkpoint demo-smollm-sft@latest"
    domains = {draft.slug for draft in smollm.drafts() if draft.kind == "domain"}
    assert set(settings["domain_weights"]) == domains and all(w > 0 for w in settings["domain_weights"].values())
    resolved = GRPOConfig.resolve({**smollm.RUN_CONFIG, **settings})
    assert resolved.domain_weights == settings["domain_weights"]
    assert resolved.learning_rate == settings["learning_rate"] > smollm.RUN_CONFIG["learning_rate"]
