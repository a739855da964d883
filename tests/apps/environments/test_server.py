"""`manage.py environments serve` as a trainer elsewhere meets it: a real server process on the test database, and
OpenEnv's own clients (GenericEnvClient, MCPToolClient) over its WebSocket. One server serves the whole module: the
demo's arithmetic, coding (run_python in a fresh sandbox per call) and repository (a sandbox session per episode)
domains in one bundle; the episodes it plays are read back from the archive as trajectories of external runs.

The server is started with small bounds (6 sessions, 4 per token, 2 s idle) so that its faults show in seconds:
a malformed action, an unknown tool, a step after the end, another project's task, a token without the scope, a
dropped WebSocket, sessions never closed, and sessions past either bound."""

import asyncio
import shlex
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from django.contrib.auth import get_user_model
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient
from websockets.exceptions import ConnectionClosed

from apps.accounts.models import Role, TokenScope
from apps.accounts.services import api_token_create, membership_set, project_create
from apps.demo import arithmetic, coding, images, repositories, verifiers
from apps.registry.models import InstanceSetMember, Version
from apps.registry.services import version_publish
from apps.runs.models import Run, RunKind
from apps.trajectories.models import Trajectory
from tests.support.environment_server import environment_server as environment_server_process
from tests.support.processes import wait_for
from tests.support.resources import require
from tests.support.specimens import IMAGE_SPEC, TEMPLATE_SPEC, VERIFIER_SPEC, addition_instances
from workers.definitions.specs import PUBLISH_ORDER

# One server for the module (make test runs a module's tests in one process).
pytestmark = [pytest.mark.postgres, pytest.mark.sandbox, pytest.mark.processes]

MAX_SESSIONS, PER_TOKEN, IDLE_SECONDS = 6, 4, 2.0
DOMAINS = ["arithmetic", "python-coding", "python-repositories"]


def _publish_world(tmp: Path) -> SimpleNamespace:
    """The demo's drafts of three domains in a project of their own, a bundle of them, and a second project whose
    template the server must never serve; committed, for the server process to read."""
    User = get_user_model()
    owner = User.objects.create_user("trainer", password="pw-for-tests")
    viewer = User.objects.create_user("onlooker", password="pw-for-tests")
    project = project_create(team_slug="elsewhere", slug="elsewhere", name="Trained elsewhere", owner=owner)
    membership_set(project=project, user=viewer, role=Role.VIEWER, actor=owner)
    drafts = [*images.drafts()[:1], *verifiers.drafts(), *arithmetic.drafts(), *coding.drafts(),
              *repositories.drafts()]
    for draft in sorted(drafts, key=lambda d: PUBLISH_ORDER.index(d.kind)):
        if draft.kind != "bundle" and draft.slug not in ("multi-step", "word-problems"):  # not served here
            version_publish(project=project, kind=draft.kind, slug=draft.slug, spec=draft.spec, author=owner,
                            instances=draft.instances, via="cli")
    version_publish(project=project, kind="bundle", slug="elsewhere", author=owner,
                    spec={"members": [f"domain/{domain}@latest" for domain in DOMAINS]})
    other_owner = User.objects.create_user("mallory", password="pw-for-tests")
    other = project_create(team_slug="other", slug="other-team", name="Other", owner=other_owner)
    for kind, slug, spec, extra in (("sandbox_image", "py-basic", IMAGE_SPEC, {}),
                                    ("verifier", "numeric", VERIFIER_SPEC, {}),
                                    ("task_template", "secret-sums", {**TEMPLATE_SPEC, "verifier": "numeric"},
                                     {"instances": addition_instances(3)})):
        version_publish(project=other, kind=kind, slug=slug, spec=spec, author=other_owner, **extra)

    def token(user, name, scope, on=project):
        return api_token_create(user=user, name=name, project=on, scope=scope, via="api")[1]

    return SimpleNamespace(
        project=project, owner=owner, token=token(owner, "trainer-token", TokenScope.ENVIRONMENT),
        second_token=token(owner, "second-trainer", TokenScope.ENVIRONMENT),
        write_token=token(owner, "ci", TokenScope.WRITE),
        other_token=token(other_owner, "other", TokenScope.ENVIRONMENT, on=other),
        data_dir=tmp / "data", logs=tmp)


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker, tmp_path_factory):
    """The server process, serving bundle `elsewhere`; its base URL (with a token: `server.url(token)`)."""
    require("postgres", "sandbox")
    tmp = tmp_path_factory.mktemp("environments")
    with django_db_blocker.unblock():
        world = _publish_world(tmp)
    with environment_server_process(bundle="elsewhere", project="elsewhere", data_dir=world.data_dir, logs=tmp,
                                    django_db_blocker=django_db_blocker,
                                    options=("--max-sessions", str(MAX_SESSIONS), "--max-sessions-per-token",
                                             str(PER_TOKEN), "--idle-timeout", str(IDLE_SECONDS))) as (base, process):
        port = base.rsplit(":", 1)[1]
        world.base = base
        world.url = lambda token: f"http://trainer:{token}@127.0.0.1:{port}"
        world.process = process
        yield world


def _hidden(project, template: str, key: str) -> dict:
    version = Version.objects.get(definition__project=project, definition__slug=template)
    return InstanceSetMember.objects.select_related("instance").get(
        instance_set_id=version.instance_set_id, key=key).instance.hidden


def _episode(server, episode_id: str) -> Trajectory:
    return wait_for(lambda: Trajectory.objects.filter(pk=episode_id).select_related("run").first(), seconds=10,
                    what=f"episode {episode_id} in the archive", logs=server.logs)


def _pool_busy(world) -> int:
    """Sandboxes the server's pool holds (its status file, published every second)."""
    import json

    files = list((world.data_dir / "sandbox-pools").glob(f"pool-{world.process.pid}-*.json"))
    return sum(image["busy"] for path in files for image in json.loads(path.read_text())["images"])


def test_a_repository_episode_in_one_session_is_graded_and_recorded(server, db):
    """The stateful template: the editor's fix is in the workspace when bash looks; submit grades the workspace's
    diff with the hidden tests, and the turns the client reports are recorded with the server's tool results."""
    # The first tool call starts the session's sandbox with the repository's workspace: in a fresh-clone CI run on
    # 2 loaded cores it once took longer than the client's default 60 s to answer.
    with GenericEnvClient(base_url=server.url(server.token), message_timeout_s=300).sync() as env:
        reset = env.reset(template="repository-bugfix", seed=0, run="trl-on-repos", trainer_step=3, client="trl",
                          model="tiny-policy")
        first = reset.observation
        assert not reset.done and first["run"] == "trl-on-repos"
        assert first["task"]["template"] == "task_template/repository-bugfix@1"
        assert [tool["name"] for tool in first["tool_schemas"]] == ["bash", "str_replace_editor", "submit"]
        assert "tests now fail" in first["messages"][-1]["content"]
        listed = env.step({"type": "list_tools"}).observation["tools"]
        assert {tool["name"] for tool in listed} == {"bash", "str_replace_editor", "submit"}

        patch = _hidden(server.project, "repository-bugfix", first["task"]["task"])["patch"]
        path = next(line[6:] for line in patch.splitlines() if line.startswith("+++ b/"))
        removed = [line[1:] for line in patch.splitlines() if line.startswith("-") and not line.startswith("---")]
        added = [line[1:] for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++")]

        def occurrences(line: str) -> int:  # of `line` in the file, as bash finds it in the session's workspace
            found = env.step({"type": "call_tool", "tool_name": "bash", "arguments": {
                "command": f"grep -cxF -- {shlex.quote(line)} {path}"}})
            return int(found.observation["result"]["data"].split()[-1])

        before = occurrences(removed[0])
        edit = env.step({"type": "call_tool", "tool_name": "str_replace_editor", "arguments": {
            "command": "str_replace", "path": path, "old_str": "\n".join(removed), "new_str": "\n".join(added)}})
        assert not edit.done and "edited" in edit.observation["result"]["data"].lower(), edit.observation
        assert occurrences(removed[0]) == before - 1  # the edit is there for the next call: one session

        conversation = first["messages"] + [  # as the trainer's client has it: its model's turns, its copies
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "b1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "b1", "content": "(the client's copy)"},
            {"role": "assistant", "content": "I fix it.", "tool_calls": [
                {"id": "a1", "type": "function", "function": {"name": "str_replace_editor", "arguments": "{}"}}]},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "b2", "name": "bash", "arguments": {}}]},
            {"role": "assistant", "content": "Submitting.", "tool_calls": [
                {"id": "a3", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]}]
        done = env.step({"type": "call_tool", "tool_name": "submit", "arguments": {"messages": conversation}})
        assert done.done and done.reward == 1.0
        outcome = done.observation["result"]["data"]
        assert outcome["episode"] == first["episode_id"] and outcome["verdict"] == "pass"
        assert outcome["layers"]["repository-tests"][0]["status"] == "pass"

    row = _episode(server, first["episode_id"])
    assert row.run.kind == RunKind.EXTERNAL and row.run.name == "trl-on-repos"
    assert row.run.config["client"] == "trl" and row.run.config["trainer_model"] == "tiny-policy"
    assert row.step == 3 and row.reward == 1.0 and row.status == "ok"
    assistant = [turn["content"] for turn in row.turns if turn["role"] == "assistant"]
    assert assistant == ["Let me look.", "I fix it.", "", "Submitting."]
    tools = [turn for turn in row.turns if turn["role"] == "tool"]
    assert [(turn["name"], turn["tool_call_id"]) for turn in tools] == [
        ("bash", "b1"), ("str_replace_editor", "a1"), ("bash", "b2"), ("submit", "a3")]
    assert tools[0]["content"] != "(the client's copy)"  # the server's results are what happened
    assert tools[1]["content"].startswith("Edited") and tools[1]["result"]["workspace_diff"]
    assert row.timings["environment_assembly"] > 0 and row.timings["verification"] > 0


def test_a_stateless_episode_through_mcp_tool_client(server, db):
    """run_python runs each call in a fresh sandbox (a file one call writes is gone at the next); an unknown tool is
    the model's mistake, which the client raises and the episode survives; submit(answer) returns the verdict. The
    run is named after the token when the reset names none."""
    version = Version.objects.get(definition__project=server.project, definition__slug="python-functions")
    member = InstanceSetMember.objects.filter(instance_set_id=version.instance_set_id).order_by("key").first()
    solution = f"```python\n{member.instance.hidden['canonical_solution']}```"

    async def play():
        async with MCPToolClient(base_url=server.url(server.token)) as env:
            await env.reset(template="python-functions", task=member.key)
            assert [tool.name for tool in await env.list_tools()] == ["run_python", "submit"]
            assert "42" in await env.call_tool("run_python", code="open('note', 'w').write('x'); print(6 * 7)")
            assert "FileNotFoundError" in await env.call_tool("run_python", code="print(open('note').read())")
            with pytest.raises(RuntimeError, match="unknown tool 'rm'.*tool_not_found"):
                await env.call_tool("rm", path="/")
            outcome = await env.call_tool("submit", answer=solution)
            return (await env.state()).episode_id, outcome

    episode_id, outcome = asyncio.run(play())
    assert outcome["reward"] == 1.0 and outcome["layers"]["unit-tests"][0]["status"] == "pass", outcome
    row = _episode(server, episode_id)
    assert row.run.name == "trainer-token" and row.run.config["client"] == "openenv"
    assert row.reward == 1.0 and row.status == "ok" and row.template == version.ref
    assert [turn["result"]["status"] for turn in row.turns if turn["role"] == "tool"] == ["ok", "error", "policy_error"]
    assert row.turns[-1] == {**row.turns[-1], "role": "assistant", "content": solution}


def test_bad_actions_and_bad_resets_are_clear_errors_and_the_session_goes_on(server, db):
    with GenericEnvClient(base_url=server.url(server.token)).sync() as env:
        with pytest.raises(RuntimeError, match="no episode yet: reset first"):
            env.step({"type": "call_tool", "tool_name": "submit", "arguments": {"answer": "1"}})
        with pytest.raises(RuntimeError, match="serves no template 'secret-sums'; it serves .*add-two"):
            env.reset(template="secret-sums")  # another project's template
        with pytest.raises(RuntimeError, match="no template of bundle/elsewhere@1 has a task 'add-00001'"):
            env.reset(task="add-00001")  # another project's task
        with pytest.raises(RuntimeError, match="reset takes seed, .*; not temperature"):
            env.reset(temperature=0.5)
        with pytest.raises(RuntimeError, match="trainer_step must be a whole number"):
            env.reset(trainer_step="three")
        first = env.reset(domain="arithmetic", seed=11, run="faults").observation
        assert first["task"]["template"] == "task_template/add-two@1"
        second = env.reset(domain="arithmetic", seed=11, run="faults").observation  # leaves the first unfinished
        assert second["task"] == first["task"] and second["episode_id"] != first["episode_id"]  # the seed's draw
        with pytest.raises(RuntimeError, match="Invalid message.*VALIDATION_ERROR"):
            env.step({"type": "dance"})
        with pytest.raises(RuntimeError, match="Invalid message.*VALIDATION_ERROR"):
            env.step({"type": "call_tool", "tool_name": "submit", "arguments": "42"})
        wrong = env.step({"type": "call_tool", "tool_name": "run_python", "arguments": {"code": "1"}})
        assert not wrong.done and wrong.observation["error"]["error_type"] == "tool_not_found"
        missing = env.step({"type": "call_tool", "tool_name": "submit", "arguments": {}})
        assert not missing.done and missing.observation["error"] == {"error_type": "invalid_args",
                                                                      "message": "submit needs answer"}
        answer = str(_hidden(server.project, "add-two", second["task"]["task"])["answer"])
        done = env.step({"type": "call_tool", "tool_name": "submit", "arguments": {"answer": answer}})
        assert done.done and done.reward == 1.0
        with pytest.raises(RuntimeError, match=f"episode {second['episode_id']} is over .*reset for the next one"):
            env.step({"type": "call_tool", "tool_name": "submit", "arguments": {"answer": answer}})
        assert not env.reset(domain="arithmetic", run="faults").done  # and the session plays on
    runs = Run.objects.filter(project=server.project, name="faults")
    assert runs.count() == 1 and Trajectory.objects.filter(run__in=runs, status="ok", reward=1.0).count() == 1
    # The first reset's episode was left by the second reset, the last by the closing client: both abandoned.
    wait_for(lambda: Trajectory.objects.filter(run__in=runs, status="abandoned").count() == 2, seconds=5,
             what="two abandoned episodes", logs=server.logs)


def test_only_a_token_with_the_environment_scope_of_the_project_plays(server, db):
    for token, why in ((server.write_token, "scope is write; playing environments takes a token with the "
                                            "environment scope"),
                       (server.other_token, "this API token is for project other-team"),
                       ("pts_nothing_here", "unknown, expired or revoked")):
        with GenericEnvClient(base_url=server.url(token)).sync() as env:
            with pytest.raises(RuntimeError, match=why):
                env.reset()
    assert httpx.post(f"{server.base}/reset", json={}).status_code == 401
    headers = {"Authorization": f"Bearer {server.token}"}
    shown = httpx.post(f"{server.base}/reset", json={"template": "add-two", "seed": 1}, headers=headers)
    assert shown.status_code == 200 and shown.json()["observation"]["run"] == ""  # a stateless look: not recorded
    refused = httpx.post(f"{server.base}/step", headers=headers,
                         json={"action": {"type": "call_tool", "tool_name": "submit", "arguments": {"answer": "1"}}})
    assert refused.status_code == 409 and "connect to /ws" in refused.json()["detail"]
    assert httpx.get(f"{server.base}/schema", headers=headers).json()["action"]["title"] == "CallToolAction"
    with pytest.raises(ValueError, match="needs an editor or an owner, and your role there is viewer"):
        api_token_create(user=get_user_model().objects.get(username="onlooker"), name="x", project=server.project,
                         scope=TokenScope.ENVIRONMENT)


def test_a_dropped_websocket_gives_its_sandbox_back_and_its_episode_is_abandoned(server, db):
    async def play_and_drop():
        env = GenericEnvClient(base_url=server.url(server.token))
        reset = await env.reset(template="repository-bugfix", seed=1, run="dropped")
        await env.step({"type": "call_tool", "tool_name": "bash", "arguments": {"command": "ls"}})
        wait_for(lambda: _pool_busy(server) >= 1, seconds=5, what="the session's sandbox", logs=server.logs)
        env._ws.transport.abort()  # the trainer's process dies: no close frame, the connection just goes
        return reset.observation["episode_id"], time.monotonic()

    episode_id, dropped = asyncio.run(play_and_drop())
    wait_for(lambda: _pool_busy(server) == 0, seconds=5, what="the sandbox given back", logs=server.logs)
    row = _episode(server, episode_id)
    assert time.monotonic() - dropped < 5 + 1  # the pool publishes its state every second
    assert row.status == "abandoned" and "connection closed" in row.status_reason and row.reward is None
    assert [turn["name"] for turn in row.turns if turn["role"] == "tool"] == ["bash"]


def test_sessions_past_either_bound_are_refused_at_once_and_idle_ones_are_freed(server, db):
    async def session(token, **reset):
        env = GenericEnvClient(base_url=server.url(token))
        await env.reset(template="add-two", **reset)
        return env

    async def refused(token, match):
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=match):
            await session(token)
        return time.monotonic() - started

    async def scenario():
        held = [await session(server.token, run="idle") for _ in range(PER_TOKEN)]
        waits = [await refused(server.token, f"token trainer-token holds {PER_TOKEN} sessions.*CAPACITY_REACHED")]
        held += [await session(server.second_token, run="idle") for _ in range(MAX_SESSIONS - PER_TOKEN)]
        waits.append(await refused(server.second_token, f"Server at capacity: {MAX_SESSIONS}/{MAX_SESSIONS}"))
        await asyncio.sleep(IDLE_SECONDS + 1.5)  # nobody calls: the reaper closes them all, their sockets too
        for env in held:  # the server hung up, the reason in its close frame
            with pytest.raises(ConnectionClosed, match=f"1001 .*idle for more than {IDLE_SECONDS:g} s"):
                await env.step({"type": "list_tools"})
        again = [await session(server.token) for _ in range(PER_TOKEN)]  # their places are free again
        for env in held + again:
            await env.close()
        return waits

    waits = asyncio.run(scenario())
    assert max(waits) < 2, waits  # an error at once, never a hang
    idle = Trajectory.objects.filter(run__project=server.project, run__name="idle")
    assert idle.count() == MAX_SESSIONS
    assert set(idle.values_list("status", "status_reason")) == {
        ("abandoned", f"the session was idle for more than {IDLE_SECONDS:g} s")}
