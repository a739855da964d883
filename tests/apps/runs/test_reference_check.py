"""`manage.py reference_check` on the demo bundle: the references run in real sandboxes (bubblewrap), through
the real verifiers; they are archived as a run's trajectories (a 3D answer with its rendered views); a
template whose reference is wrong fails the command and is named in the run's events. That a reference check has no
model, and that no run with a model answers with the references, needs no sandbox."""

import ast
import json

import pytest
from django.core.management import CommandError, call_command

from apps.accounts.models import Project
from apps.registry.models import Version
from apps.registry.services import version_publish
from apps.runs.models import EventKind, Run, RunKind, RunStatus
from apps.runs.services import RunError, run_create
from apps.trajectories.artifacts import artifact_open
from apps.trajectories.models import Trajectory


@pytest.fixture
def demo(db):
    call_command("seed_demo", stdout=open("/dev/null", "w"))
    return Project.objects.get(slug="demo")


def _check(capsys, *args):
    capsys.readouterr()
    call_command("reference_check", "--json", *args)
    return json.loads(capsys.readouterr().out)


@pytest.mark.sandbox
def test_the_demo_references_pass_and_are_archived_with_their_renders(demo, capsys):
    summary = _check(capsys, "--bundle", "demo", "--per-template", "1")
    run = Run.objects.get(pk=summary["run"])
    assert run.status == RunStatus.COMPLETED and run.kind == RunKind.REFERENCE
    rows = {row.domain: row for row in Trajectory.objects.filter(run=run)}
    assert set(rows) == {"arithmetic", "word-problems", "python-coding", "3d-modelling", "document-qa"}
    assert summary["checked"] == summary["passed"] == 5 and summary["failed"] == summary["ungraded"] == 0
    for domain, row in rows.items():
        assert row.reward == 1.0, (domain, row.verdict)
    # No judge is configured here, and the document-QA reference needs none: its quotes are all in the documents,
    # so the citations layer decides.
    assert rows["document-qa"].verdict["layers_run"] == ["answer", "citations"]
    coding = rows["python-coding"]
    assert coding.verdict["components"][0]["type"] == "unit_tests"
    # The reference first runs its solution on the prompt's example with the template's tool: what the tool
    # turn shows is the sandbox's output, and it is the example's expected value.
    tool = next(t for t in coding.turns if t["role"] == "tool")
    example = coding.turns[1]["content"].rsplit("Example: ", 1)[1]
    assert tool["result"]["status"] == "ok"
    assert tool["result"]["stdout"].strip() == str(ast.literal_eval(example.split(" == ")[1].strip()))
    assert coding.num_tool_calls == 1 and coding.turns[-1]["content"].startswith("```python")

    modelling = rows["3d-modelling"]
    assert "trimesh.creation" in modelling.turns[-1]["content"]
    renders = {a["name"]: a for a in modelling.artifacts}
    assert set(renders) == {"geometry/solid/render-iso.png", "geometry/solid/render-front.png"}
    with artifact_open(key=renders["geometry/solid/render-iso.png"]["key"]) as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"  # a real picture the verifier drew of the mesh

    assert not run.events.filter(kind=EventKind.REFERENCE_FAILED).exists()
    rewards = dict(run.metric_points.values_list("name", "value"))
    assert rewards["reward/mean"] == rewards["reward/3d-modelling"] == rewards["reward/document-qa"] == 1.0

    # Once is enough: a second `--if-absent` creates no run.
    call_command("reference_check", "--bundle", "demo", "--if-absent")
    assert Run.objects.filter(kind=RunKind.REFERENCE).count() == 1


@pytest.mark.sandbox
def test_a_wrong_reference_fails_the_command_and_is_named(demo, capsys):
    owner = demo.memberships.get(role="owner").user
    functions = Version.objects.get(definition__slug="python-functions", number=1)
    member = functions.instance_set.members.select_related("instance").order_by("key").first()
    hidden = dict(member.instance.hidden, canonical_solution=f"def {member.instance.hidden['entry_point']}(*a):\n"
                                                             "    return None\n")

    def publish(kind, slug, spec, **extra):
        return version_publish(project=demo, kind=kind, slug=slug, spec=spec, author=owner, via="cli",
                               **extra).version

    publish("task_template", "wrong-reference", functions.spec,
            instances=[{"key": member.key, "inputs": member.instance.inputs, "hidden": hidden}])
    publish("domain", "broken", {"templates": [{"template": "wrong-reference", "weight": 1.0}]})
    publish("bundle", "broken", {"members": ["domain/broken@latest"]})

    with pytest.raises(CommandError, match="1 of 1 references failed their verifier"):
        call_command("reference_check", "--bundle", "broken", "--per-template", "1")
    run = Run.objects.get(kind=RunKind.REFERENCE, bundle__definition__slug="broken")
    assert run.status == RunStatus.COMPLETED
    assert Trajectory.objects.get(run=run).reward < 1.0  # its one test of the arguments still passes
    event = run.events.get(kind=EventKind.REFERENCE_FAILED)
    assert "wrong-reference" in event.message and "1 failed" in event.message


@pytest.mark.sandbox
def test_a_reference_only_a_judge_could_grade_is_ungraded_not_a_zero(demo, capsys):
    owner = demo.memberships.get(role="owner").user
    sums = Version.objects.get(definition__slug="add-two", number=1)
    member = sums.instance_set.members.select_related("instance").order_by("key").first()

    def publish(kind, slug, spec, **extra):
        return version_publish(project=demo, kind=kind, slug=slug, spec=spec, author=owner, via="cli",
                               **extra).version

    publish("verifier", "judge-only", {"layers": [{"name": "judge", "kind": "judge", "checks": [
        {"type": "score_model", "model": "judge-small", "rubric": "Is the sum right?"}]}]})
    publish("task_template", "judged-sums", {**sums.spec, "verifier": "judge-only"},
            instances=[{"key": member.key, "inputs": member.instance.inputs, "hidden": member.instance.hidden}])
    publish("domain", "judged", {"templates": [{"template": "judged-sums", "weight": 1.0}]})
    publish("bundle", "judged", {"members": ["domain/judged@latest"]})

    # No judge is configured here (JUDGE_BASE_URL): the reference cannot be graded, which is not a failure.
    summary = _check(capsys, "--bundle", "judged", "--per-template", "1")
    assert (summary["checked"], summary["passed"], summary["failed"], summary["ungraded"]) == (1, 0, 0, 1)
    run = Run.objects.get(pk=summary["run"])
    assert run.status == RunStatus.COMPLETED and Trajectory.objects.get(run=run).reward is None
    event = run.events.get(kind=EventKind.REFERENCE_FAILED)
    assert "judged-sums" in event.message and "1 could not be graded" in event.message
    rewards = dict(run.metric_points.values_list("name", "value"))
    assert "reward/judged" not in rewards and "reward/mean" not in rewards  # ungraded is not a zero


def test_a_reference_check_has_no_model_and_no_run_with_one_answers_with_the_references(project, registry, owner):
    check = run_create(project=project, bundle=registry["bundle"], steps=1, kind=RunKind.REFERENCE, actor=owner,
                       overrides={"reference_per_template": 2})
    assert check.config == {"reference_per_template": 2, "verify_concurrency": 4, "max_tool_output_chars": 2000}
    with pytest.raises(RunError) as refused:
        run_create(project=project, bundle=registry["bundle"], steps=1, kind=RunKind.REFERENCE, actor=owner,
                   overrides={"model": "builtin:reference"})
    assert [(e.field, e.problem) for e in refused.value.errors] == [
        ("model", "model is a GRPO, SFT, DPO and evaluation setting; a reference check does not use it")]
    for kind in (RunKind.GRPO, RunKind.SFT):
        with pytest.raises(RunError, match="builtin:reference is no model: a reference check answers with the "
                                           "tasks' own references"):
            run_create(project=project, bundle=registry["bundle"], steps=1, kind=kind, actor=owner,
                       overrides={"model": "builtin:reference"})
    assert Run.objects.filter(kind__in=[RunKind.GRPO, RunKind.SFT]).count() == 0
