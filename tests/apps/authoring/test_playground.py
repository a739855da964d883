"""The playgrounds: a verifier version tried on a typed response against a real task instance (pass, fail, two
versions side by side), a task template rendered as the model sees it with its reference run through the real
sandbox and verifier, and a verifier's usage."""

import io
import json
import time

import pytest
from django.core.management import call_command
from django.urls import reverse

from apps.registry.services import version_publish
from tests.support.specimens import TEMPLATE_SPEC, VERIFIER_SPEC
from workers.definitions.specs import Limits

pytestmark = pytest.mark.django_db


def _url(name, project, slug):
    return reverse(f"authoring:{name}", kwargs={"project": project.slug, "slug": slug})


def _verify(client, project, response, **extra):
    return client.post(_url("verifier_playground", project, "numeric"),
                       {"version": 1, "template": "add-two", "key": "add-00003", "response": response, **extra})


def test_a_right_answer_passes_and_a_wrong_one_fails_with_each_check(login, member, project, registry):
    client = login(member("editor"))
    right = _verify(client, project, "3 + 3 = 6")  # add-00003: a=3, b=3
    assert right.status_code == 200
    tried, = right.context["tried"]
    assert (tried.verdict["status"], tried.verdict["reward"]) == ("pass", 1.0)
    assert tried.verdict["layers_run"] == ["exact"] and "exact decided" in tried.verdict["stopped_because"]
    assert tried.verdict["components"][0]["type"] == "numeric" and tried.verdict["latency_ms"] >= 0
    wrong, = _verify(client, project, "7").context["tried"]
    assert wrong.verdict["status"] == "fail" and wrong.verdict["reward"] == 0.0
    assert "7" in wrong.verdict["components"][0]["evidence"]


def test_two_versions_side_by_side(login, member, owner, project, registry):
    looser = {**VERIFIER_SPEC, "layers": [{**VERIFIER_SPEC["layers"][0], "escalate": None, "checks": [
        {"type": "numeric", "reference": "{answer}", "abs_tolerance": 2}]}]}
    version_publish(project=project, kind="verifier", slug="numeric", spec=looser, author=owner, message="looser")
    page = _verify(login(member("editor")), project, "7", compare=2)
    strict, loose = page.context["tried"]
    assert (strict.verifier.number, strict.verdict["status"]) == (1, "fail")
    assert (loose.verifier.number, loose.verdict["status"]) == (2, "pass")  # 7 is within 2 of 6
    assert page.content.count(b'class="tried-one"') == 2


def test_a_verifier_with_a_judge_says_when_the_judge_is_not_configured(login, member, project, registry, settings):
    settings.JUDGE_BASE_URL = ""
    page = _verify(login(member("editor")), project, "6")
    assert b"The judge is not configured" in page.content


def test_hidden_fields_named_like_dict_methods_are_listed(login, member, owner, project, registry):
    # A task's hidden fields are named by its author (or an uploaded file's columns): "items" is a field, not the
    # dict's items() (Django's template lookup tries the key first).
    version_publish(project=project, kind="task_template", slug="add-two", spec=TEMPLATE_SPEC, author=owner,
                    message="counted", instances=[{"key": "add-00003", "inputs": {"a": 3, "b": 3},
                                                   "hidden": {"answer": 6, "items": 2, "values": [3, 3]}}])
    page = _verify(login(member("editor")), project, "6")
    assert page.status_code == 200
    # PostgreSQL's jsonb keeps keys in its own order (shortest first), SQLite as written: each line, any order.
    shown = page.content.decode()
    assert all(f"{line}\n" in shown for line in ("answer: 6", "items: 2", "values: [3, 3]"))


def test_trying_needs_an_editor_and_an_unknown_instance_is_named(login, member, project, registry):
    assert _verify(login(member("viewer")), project, "6").status_code == 403
    page = _verify(login(member("editor")), project, "6", key="no-such-task")
    assert page.status_code == 400 and b"has no task instance" in page.content


def test_an_archived_answer_can_be_loaded(login, member, project, registry):
    page = login(member("editor")).get(_url("verifier_playground", project, "numeric") + "?trajectory=not-a-uuid")
    assert page.status_code == 200 and b"No trajectory not-a-uuid" in page.content


def test_usage_names_the_bundles_that_pin_it(login, member, project, registry):
    page = login(member("viewer")).get(_url("verifier_playground", project, "numeric"))
    assert page.context["usage"]["bundles"] == ["bundle/arith-bundle@1 pins verifier/numeric@1"]
    assert page.context["usage"]["trajectories"] == 0 and page.context["usage"]["pass_rate"] is None


@pytest.mark.sandbox
def test_the_template_playground_renders_the_prompt_and_runs_the_reference(login, member, project, registry):
    client = login(member("editor"))
    url = _url("template_playground", project, "add-two")
    page = client.get(url + "?key=add-00004")
    assert [m["content"] for m in page.context["prompt_messages"]] == ["What is 4 + 4?"]
    assert page.context["limits"] == Limits(max_turns=1, max_tokens=16, max_seconds=10)
    assert b"1 turn, 16 tokens in all, 10.0 s" in page.content
    ran = client.post(url + "?key=add-00004", {"key": "add-00004"})
    reference = ran.context["reference"]
    assert reference["status"] == "ok" and reference["verdict"]["status"] == "pass"
    assert [t["role"] for t in reference["turns"]] == ["user", "assistant"]


@pytest.mark.sandbox
def test_a_hostile_grader_tried_in_the_playground_is_contained(login, member, owner, project, registry, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("the host's")
    # Model-generated grading code that tries to read a file of the host and to reach the network: in the sandbox
    # neither is there, so it cannot award itself the pass.
    source = ("def grade(sample, item):\n"
              "    import socket\n"
              f"    try:\n        open({str(secret)!r}).read()\n        return 1.0\n"
              "    except OSError:\n        pass\n"
              "    try:\n        socket.create_connection(('1.1.1.1', 53), timeout=2)\n        return 1.0\n"
              "    except OSError:\n        return 0.0\n")
    version_publish(project=project, kind="verifier", slug="numeric", author=owner, message="hostile", spec={
        "layers": [{"name": "exact", "kind": "exact", "checks": [{"type": "python_grader", "source": source}]}]})
    tried, = _verify(login(member("editor")), project, "6", version=2).context["tried"]
    assert tried.verdict["reward"] == 0.0 and tried.verdict["status"] == "fail"


@pytest.mark.sandbox
def test_a_correct_function_pasted_in_the_browser_passes_its_hidden_tests(login, member, owner, project, registry):
    version_publish(project=project, kind="verifier", slug="unit-tests", author=owner, spec={"layers": [
        {"name": "exact", "kind": "exact", "checks": [{"type": "unit_tests", "timeout_seconds": 10}]}]})
    version_publish(project=project, kind="task_template", slug="write-add", author=owner,
                    spec={**TEMPLATE_SPEC, "prompt_template": "Write add(a, b).", "verifier": "unit-tests"},
                    instances=[{"key": "add", "inputs": {}, "hidden": {
                        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n", "entry_point": "add"}}])
    # What a browser sends from the response textarea: every line ends in "\r\n".
    pasted = "```python\r\ndef add(a, b):\r\n    return a + b\r\n```\r\n"
    client = login(member("editor"))
    page = client.post(_url("verifier_playground", project, "unit-tests"), {
        "version": 1, "template": "write-add", "key": "add", "response": pasted})
    tried, = page.context["tried"]
    assert (tried.verdict["status"], tried.verdict["reward"]) == ("pass", 1.0), tried.verdict["components"]
    # A second try borrows a sandbox from the same pool, kept warm between requests (a pool started for each one
    # started its sandboxes cold every time: about a minute a request beside a training run).
    subtracts = "```python\ndef add(a, b):\n    return a - b\n```"
    wrong, = client.post(_url("verifier_playground", project, "unit-tests"), {
        "version": 1, "template": "write-add", "key": "add", "response": subtracts}).context["tried"]
    assert wrong.verdict["status"] == "fail"
    # A pool publishes its status every second, its image once it has one; on a loaded machine (CI's parallel test
    # processes) the sandbox given back takes a while to be warm again.
    deadline = time.monotonic() + 30
    while not _kept_warm(pools := _pool_status()) and time.monotonic() < deadline:
        time.sleep(0.2)
    pool, = pools
    image, = pool["images"]
    assert image["wait_for_sandbox"]["count"] == 2 and image["warm"] + image["resetting"] >= 1, image


def _kept_warm(pools: list[dict]) -> bool:
    """The first pool's first image handed out two sandboxes and keeps one warm or resetting, as its status says."""
    if not pools or not pools[0]["images"]:
        return False
    image = pools[0]["images"][0]
    return image["wait_for_sandbox"]["count"] >= 2 and image["warm"] + image["resetting"] >= 1


def _pool_status() -> list[dict]:
    """The sandbox pools running in this machine's processes, as `manage.py sandbox pool-status` lists them."""
    out = io.StringIO()
    call_command("sandbox", "pool-status", stdout=out)
    return json.loads(out.getvalue())["pools"]
