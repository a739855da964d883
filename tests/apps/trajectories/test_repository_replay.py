"""A repository task's reference walk: more than twenty tool calls in one sandbox session, archived, verified by
replaying its final diff in a fresh sandbox, and replayed on the trajectory page with each step's command, its
output (folded when long) and the workspace's diff, then the final diff against the base."""

import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from apps.demo import repositories
from apps.registry.services import version_publish
from apps.trajectories.models import Trajectory
from workers.rl.tasks.repository_mutations import instances_from_record
from workers.verifiers.repository import archive_files

# Committed, not in a test's transaction: the reference check's heartbeat writes from a thread of its own.
pytestmark = [pytest.mark.sandbox, pytest.mark.django_db(transaction=True)]

DEEP_FIX = "inflection-inflection-init-l393c17-swap-arguments"  # its fix is far down the file: a long read


@pytest.fixture
def bundle(project, owner):
    record = json.loads((repositories.RECORDS / "inflection.json").read_text())
    record["mutations"] = [m for m in record["mutations"] if f"l{m['line']}c{m['column']}" in DEEP_FIX]
    instances = instances_from_record(archive_files(repositories.SOURCES / record["source"]), record)
    drafts = {draft.slug: draft for draft in repositories.drafts()}

    def publish(kind, slug, spec, instances=None):
        version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner, instances=instances)

    for slug in ("python-pytest", "repository-tests"):
        publish(drafts[slug].kind, slug, drafts[slug].spec)
    publish("task_template", "repository-bugfix", drafts["repository-bugfix"].spec, instances)
    publish("domain", "python-repositories", drafts["python-repositories"].spec)
    publish("bundle", "one-repository-task", {"members": ["domain/python-repositories@latest"]})
    return project


def test_twenty_tool_calls_in_one_session_archive_replay_and_verify(bundle, client, owner, capsys):
    call_command("reference_check", "--bundle", "one-repository-task", "--per-template", "1", "--json")
    summary = json.loads(capsys.readouterr().out)
    assert summary["passed"] == 1, summary
    row = Trajectory.objects.get(run_id=summary["run"])
    tools = [turn for turn in row.turns if turn["role"] == "tool"]
    assert len(tools) >= 20 and row.reward == 1.0 and row.verdict["components"][0]["type"] == "repository_tests"
    # One workspace throughout: the edit of one call is in the diff every later call recorded, and the tests run
    # after it in the same workspace pass.
    edits = [i for i, turn in enumerate(tools) if turn["name"] == "str_replace_editor"
             and "Edited" in turn["content"]]
    assert edits and all(t["result"].get("workspace_diff") in (None, tools[edits[0]]["result"]["workspace_diff"])
                         for t in tools[edits[0]:])
    assert "passed" in tools[-2]["content"] and "failed" not in tools[-2]["content"]
    assert tools[-1]["name"] == "submit" and "+    normalized = unicodedata.normalize('NFKD', string)" in \
        tools[-1]["result"]["workspace_diff"]

    client.force_login(owner)
    page = client.get(reverse("trajectories:trajectory_detail", kwargs={"project": bundle.slug,
                                                                       "trajectory_id": row.pk})).content.decode()
    assert page.count('class="tool-command"') == len(tools)  # every call names what it ran
    assert "<code>python -m pytest -q 2&gt;&amp;1 | tail -5</code>" in page
    assert page.count('<details class="tool-output">') >= 1 and page.count('<details class="tool-output" open>') >= 1
    assert "workspace unchanged by this step" in page and "Final diff against the base" in page
    # The edit's step and the final diff show the fix.
    assert page.count("+    normalized = unicodedata.normalize(&#x27;NFKD&#x27;, string)") >= 2
