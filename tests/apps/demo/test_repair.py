"""The repair domain (apps/demo/repair.py): tasks rebuilt from their records, split by whole function families, the
run_tests tool's report in a real session, and the expert trajectories replayed through the real sandbox by the
reference check, of which only those scoring 1 reach the SFT dataset."""

import json
import random

import pytest
from django.core.management import CommandError, call_command
from transformers import AutoTokenizer

from apps.datasets.services import dataset_build
from apps.demo import repair, repositories
from apps.registry.dataset_store import dataset_materialise
from apps.registry.models import Version
from apps.registry.pins import bundle_tasks
from apps.registry.services import version_publish
from apps.trajectories.models import Trajectory
from tests.support.repository import REPOSITORY_IMAGE
from tests.support.resources import require
from workers.definitions.specs import SessionSettings, ToolSpec
from workers.rl.models.base_model import line_edit, reference_turns
from workers.rl.models.chat_formats import HFChat
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.rollout.sessions import workspace_for
from workers.rl.rollout.swe_tools import REPAIR_TOOLS, SweToolSet, editor_commands
from workers.rl.rollout.tools import PolicyToolError
from workers.rl.tasks.repository_mutations import file_diff
from workers.sandbox import SandboxPool
from workers.sandbox.layers import DEFAULT_ROOT, LayerCache
from workers.sandbox.process import ProcessBackend
from workers.verifiers import Item
from workers.verifiers.repository import snapshot_contents


@pytest.fixture(scope="module")
def tasks():
    return repair.instances()


@pytest.fixture(scope="module")
def clamp_task(tasks):
    """A one-line function with an off-by-one: its fix is known here."""
    return next(t for t in tasks if t["key"] == "clamp-minus-5-5-solution-l2c28-off-by-one")


def _turn_calls(task) -> list[tuple[str, dict]]:
    tools = [ToolSpec(**tool) for tool in REPAIR_TOOLS]
    turns = reference_turns(tools=tools, inputs=task["inputs"], hidden=task["hidden"],
                            rng=random.Random(0))
    return [(call["name"], call["arguments"]) for call in
            (json.loads(turn["content"].removeprefix("<tool_call>").removesuffix("</tool_call>")) for turn in turns)]


def test_the_held_out_split_shares_no_function_and_no_family_with_training(tasks):
    training, held = repair.split(tasks)
    assert len(training) + len(held) == len(tasks) and len(tasks) >= 200
    assert 0.15 <= len(held) / len(tasks) <= 0.35
    for side in ("family", "function"):
        def of(chosen, side=side):
            return {t["inputs"]["family"] if side == "family" else t["hidden"]["entry_point"] for t in chosen}
        assert of(training).isdisjoint(of(held)), side
    # Whole functions too: no source function gives a task to both sides.
    assert {t["key"].split("-solution-")[0] for t in training}.isdisjoint(t["key"].split("-solution-")[0]
                                                                          for t in held)


def test_the_prompt_shows_the_buggy_function_and_not_the_tests(tasks, clamp_task):
    prompt = repair.PROMPT.format(**clamp_task["inputs"])
    assert "def clamp_all(xs):\n    return [min(max(x, -5), 6) for x in xs]" in prompt
    assert "clamped to the range [-5, 5]" in prompt
    for task in tasks:
        assert "FAILED" not in task["inputs"]["function"] and task["inputs"]["function"].startswith("def ")
        files = snapshot_contents(task["inputs"]["repository"])
        assert set(files) == {repair.SOLUTION, repair.VISIBLE}  # the hidden tests travel as the test patch
        assert repair.HIDDEN in task["hidden"]["test_patch"]
        assert any(test.startswith(repair.VISIBLE) for test in task["hidden"]["FAIL_TO_PASS"])


def test_the_expert_trajectory_replaces_the_line_it_viewed(clamp_task):
    calls = _turn_calls(clamp_task)
    assert [name for name, _ in calls] == ["run_tests", "str_replace_editor", "str_replace_editor", "run_tests",
                                           "submit"]
    assert calls[1][1] == {"command": "view", "path": "solution.py"}  # a short file whole: where the bug is, unknown
    assert calls[2][1] == {"command": "str_replace", "path": "solution.py",
                           "old_str": "return [min(max(x, -5), 6) for x in xs]",
                           "new_str": "return [min(max(x, -5), 5) for x in xs]"}


@pytest.mark.parametrize(("before", "after", "edit"), [
    # a line whose text recurs elsewhere keeps its indentation; a removed branch comes back whole
    ("def f(x):\n    if x:\n        return 1\n    return 1\n", "def f(x):\n    if x:\n        return 2\n    return 1\n",
     ("        return 1", "        return 2", 3)),
    ("def f(x):\n    pass\n    return x\n", "def f(x):\n    if x < 0:\n        x = 0\n    return x\n",
     ("pass", "if x < 0:\n        x = 0", 2)),
])
def test_an_expert_edit_is_whole_lines_unique_in_the_file(before, after, edit):
    assert line_edit(before, after) == edit
    old_str, new_str, _ = edit
    assert before.count(old_str) == 1 and before.replace(old_str, new_str) == after


# --- in the sandbox ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pool():
    require("sandbox")
    pool = SandboxPool(ProcessBackend(layers=LayerCache(DEFAULT_ROOT)))
    pool.warm(REPOSITORY_IMAGE)
    yield pool
    pool.close()


@pytest.mark.sandbox
def test_run_tests_reports_the_failing_calls_then_all_passed(pool, clamp_task):
    item = Item(key=clamp_task["key"], inputs=clamp_task["inputs"], hidden=clamp_task["hidden"])
    tools = [ToolSpec(**tool) for tool in REPAIR_TOOLS]
    with pool.open_session(REPOSITORY_IMAGE, SessionSettings(idle_timeout=60, lifetime=120, max_calls=20),
                           workspace=workspace_for(item)) as session:
        workspace = SweToolSet(session, editor_commands=editor_commands(tools))
        failing = workspace.call("run_tests", {})
        lines = failing.text.splitlines()
        assert failing.exit_code == 1 and lines[-1] == "4 failed, 1 passed", failing.text
        assert lines[0] == ("FAILED test_solution.py::test_clamp_all[case2] - AssertionError: clamp_all([-6, -5, 5, "
                            "6]) returned [-5, -5, 5, 6], expected [-5, -5, 5, 5]")
        assert lines[3] == "(and 1 more)" and len(failing.text) < 600  # short enough for a small model
        with pytest.raises(PolicyToolError, match="one of view, str_replace"):  # what the schema offers
            workspace.call("str_replace_editor", {"command": "create", "path": "x.py", "file_text": ""})
        workspace.call("str_replace_editor", {"command": "str_replace", "path": "solution.py", "old_str": "6)",
                                              "new_str": "5)"})
        passing = workspace.call("run_tests", {})
        assert passing.exit_code == 0 and passing.text == "5 passed", passing.text
        assert passing.workspace_diff is None  # the tests write no cache or bytecode into the workspace
        workspace.call("str_replace_editor", {"command": "str_replace", "path": "solution.py",
                                              "old_str": "xs]", "new_str": "xs"})
        broken = workspace.call("run_tests", {})
        assert broken.exit_code == 2 and "SyntaxError" in broken.text and broken.text.endswith("1 error"), \
            broken.text


@pytest.mark.sandbox
@pytest.mark.django_db(transaction=True)  # the reference check's heartbeat writes from a thread of its own
def test_expert_trajectories_replay_to_1_and_a_wrong_edit_is_left_out_of_the_sft_data(tasks, clamp_task, project,
                                                                                      owner, tmp_path):
    chosen = [t for t in tasks if t["key"].startswith(("rotate-left-1-", "fizzbuzz-2-3-fizzbuzz-", "scale-2-shift-1-"))]
    wrong = dict(clamp_task, key="clamp-wrong-edit")
    broken = snapshot_contents(clamp_task["inputs"]["repository"])[repair.SOLUTION].decode()
    # Its edit changes the bound, to the wrong value: the reference trajectory runs, edits and submits, and fails.
    wrong["hidden"] = dict(clamp_task["hidden"], patch=file_diff(repair.SOLUTION, broken, broken.replace("6)", "7)")))
    drafts = {draft.slug: draft for draft in repair.drafts()}

    def publish(kind, slug, spec, instances=None):
        version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner, instances=instances)

    publish("sandbox_image", "python-pytest", repositories.IMAGE)
    publish("verifier", "repository-tests", repositories.VERIFIER)
    publish("task_template", repair.TEMPLATE, drafts[repair.TEMPLATE].spec, [*chosen, wrong])
    publish("domain", repair.DOMAIN, drafts[repair.DOMAIN].spec)
    publish("bundle", "repair-sample", {"members": [f"domain/{repair.DOMAIN}@latest"]})
    with pytest.raises(CommandError, match=f"1 of {len(chosen) + 1} references failed"):  # the wrong edit's
        call_command("reference_check", "--bundle", "repair-sample", "--per-template", str(len(chosen) + 1))
    rows = {row.task_key: row for row in Trajectory.objects.filter(template__contains=repair.TEMPLATE)}
    assert len(rows) == len(chosen) + 1 >= 4
    for task in chosen:
        row = rows[task["key"]]
        tools = [turn for turn in row.turns if turn["role"] == "tool"]
        assert row.reward == 1.0, (task["key"], row.verdict)
        assert "failed" in tools[0]["content"] and tools[0]["result"]["exit_code"] == 1
        assert tools[3]["content"].endswith("passed") and tools[3]["result"]["exit_code"] == 0
    assert rows["clamp-wrong-edit"].reward == 0.0
    version = dataset_build(project=project, slug="repair-cold-start", fmt="sft", actor=owner,
                            sources=[{"type": "reference_check", "bundle": "repair-sample"}]).version
    path = dataset_materialise(project=project, text=f"dataset/repair-cold-start@{version.number}").path
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert {row["provenance"]["task_key"] for row in kept} == {task["key"] for task in chosen}
    # Each row carries the tools its prompt offered, so SFT renders the context the policy samples in.
    # Each row carries the tools its prompt offered, so SFT trains in the context the policy samples in: the system
    # message the rollout's chat renders (tools as the registry gives them) is the one the row's renders (tools as
    # the dataset file gives them, its keys in another order).
    [template] = bundle_tasks(bundle=Version.objects.get(definition__slug="repair-sample")).templates.values()
    chat = HFChat(AutoTokenizer.from_pretrained(str(make_tiny_hf_model(tmp_path / "tiny"))))
    prompt = [m for m in kept[0]["messages"] if m["role"] in ("system", "user")]
    assert [row["tools"] for row in kept] == [kept[0]["tools"]] * len(kept)
    assert chat.prompt(prompt, kept[0]["tools"]) == chat.prompt(prompt, list(template.tool_schemas))
    assert chat.prompt(prompt, kept[0]["tools"]) != chat.prompt(prompt, [])
