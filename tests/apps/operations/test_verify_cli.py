"""`manage.py verify` on the demo's coding tasks: canonical solutions score 1, wrong ones 0."""

import json

import pytest
from django.core.management import CommandError, call_command

from apps.registry.models import InstanceSetMember, Version

pytestmark = pytest.mark.sandbox


@pytest.fixture
def demo(db):
    call_command("seed_demo", stdout=open("/dev/null", "w"))
    template = Version.objects.get(definition__slug="python-functions", number=1)
    members = InstanceSetMember.objects.filter(instance_set_id=template.instance_set_id).select_related("instance")
    by_family = {}
    for member in members.order_by("key"):
        by_family.setdefault(member.key.rsplit("-", 1)[0], member)
    return list(by_family.values())[:6]  # one task from each of several families


def test_batch_scores_canonical_one_and_wrong_zero_in_order(demo, tmp_path, capsys):
    lines = []
    for member in demo:
        hidden = member.instance.hidden
        lines.append({"task_key": member.key, "response": f"```python\n{hidden['canonical_solution']}```"})
        lines.append({"task_key": member.key, "response": f"```python\ndef {hidden['entry_point']}(*a, **k):\n"
                                                          "    return None\n```"})
    batch = tmp_path / "batch.jsonl"
    batch.write_text("\n".join(json.dumps(line) for line in lines))
    capsys.readouterr()
    call_command("verify", "--template", "python-functions", "--batch", str(batch), "--concurrency", "2")
    verdicts = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [v["task_key"] for v in verdicts] == [line["task_key"] for line in lines]
    assert [v["reward"] for v in verdicts] == [1.0, 0.0] * len(demo), [v["components"][0]["evidence"] for v in verdicts]
    assert verdicts[0]["verifier"] == "verifier/python-unit-tests@1"
    assert verdicts[0]["components"][0]["type"] == "unit_tests"


def test_single_response_and_clear_errors(demo, tmp_path, capsys):
    member = demo[0]
    response = tmp_path / "answer.md"
    response.write_text(f"```python\n{member.instance.hidden['canonical_solution']}```")
    capsys.readouterr()
    call_command("verify", "--template", "python-functions@1", "--task-key", member.key, "--response", str(response))
    assert json.loads(capsys.readouterr().out)["status"] == "pass"
    with pytest.raises(CommandError, match="has no task instance 'nope'"):
        call_command("verify", "--template", "python-functions", "--task-key", "nope", "--response", str(response))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_key": "x"}\nnot json\n')
    with pytest.raises(CommandError, match="line 1: KeyError.*line 2: JSONDecodeError"):
        call_command("verify", "--template", "python-functions", "--batch", str(bad))
