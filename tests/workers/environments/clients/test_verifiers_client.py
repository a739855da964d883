"""verifiers loads the studio's environments (workers/environments/clients/verifiers_env.py) through its own
`load_environment` and evaluates them with its own OpenAI client against `serve`'s app on a tiny model scripted by
position (as the field's runners' tests script it): the model checks a sum with run_python, a studio session call
run in the studio's sandbox, and submits it; the rubric's reward is the studio's verdict, and the studio holds
the episodes as trajectories of the evaluation's external run."""

import concurrent.futures
import json

import httpx
import pytest

from apps.runs.models import Run, RunKind
from apps.trajectories.models import Trajectory
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.chat_formats import CharChat
from workers.rl.serving.app import build_app

from ...rl.serving.conftest import serving
from ...rl.serving.test_openai_conformance import scripted_model
from .conftest import task_sum

pytestmark = [pytest.mark.postgres, pytest.mark.sandbox, pytest.mark.processes]

TOOL_TEXT = "exit code 0\nstdout:\n{}\n"  # what run_python answers a script that prints one line (rollout/tools.py)


def hermes(name: str, **arguments) -> str:
    """A call as `serve` writes one back into the conversation, so the model's tokens and the server's rendering
    of the client's replayed turn are the same tokens."""
    return "\n<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def drawn(server, seed: int) -> dict:
    """The task the server draws for `seed`, from OpenEnv's stateless /reset (nothing recorded)."""
    answer = httpx.post(f"{server.base}/reset", json={"seed": seed},
                        headers={"Authorization": f"Bearer {server.token}"}, timeout=30)
    return answer.json()["observation"]


def test_verifiers_evaluation_is_graded_and_recorded_by_the_studio(environment_server, monkeypatch, db):
    import verifiers as vf

    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    monkeypatch.setenv("STUDIO_TOKEN", environment_server.token)
    first = drawn(environment_server, 0)
    a = int(first["task"]["task"].removeprefix("sum-"))
    chat, question = CharChat(), first["messages"]
    check, submit = hermes("run_python", code=f"print({a} + 2)"), hermes("submit", answer=str(a + 2))
    asked = len(chat.prompt(question, []))
    answered = asked + len(chat.tokenizer.encode(check)) + 1 + len(chat.continuation(
        question, [{"role": "tool", "content": TOOL_TEXT.format(a + 2)}], []))
    model = scripted_model({asked: check, answered: submit}, context=256)  # every prompt here is as long

    env = vf.load_environment("workers.environments.clients.verifiers_env", url=environment_server.base,
                              run="verifiers-eval", model="scripted", examples=2)
    engine = TorchEngine(model)
    try:
        with serving(build_app(engine=engine, chat=chat, model_name="scripted")) as url:
            client = vf.ClientConfig(api_base_url=url, api_key_var="OPENAI_API_KEY", max_retries=0)
            # verifiers runs its own event loop: a thread of its own, as the runners' tests give Inspect's
            with concurrent.futures.ThreadPoolExecutor(1) as thread:
                results = thread.submit(env.evaluate_sync, client, "scripted", num_examples=2,
                                        sampling_args={"temperature": 0, "max_tokens": 120}).result()
    finally:
        engine.close()

    outputs = sorted(results["outputs"], key=lambda output: output["info"]["seed"])
    keys = [first["task"]["task"], drawn(environment_server, 1)["task"]["task"]]
    for output, key in zip(outputs, keys, strict=True):
        right = task_sum(key) == a + 2
        assert output["error"] is None and output["stop_condition"] == "has_final_env_response"
        assert output["reward"] == (1.0 if right else 0.0)  # the rubric is the studio's verdict
        assert output["metrics"]["studio_scored"] == 1.0
        tools = [message for message in output["completion"] if message["role"] == "tool"]
        assert [message["content"] for message in tools] == [TOOL_TEXT.format(a + 2), "submitted"]

    run = Run.objects.get(project=environment_server.project, name="verifiers-eval")
    assert run.kind == RunKind.EXTERNAL
    assert (run.config["client"], run.config["trainer_model"]) == ("verifiers", "scripted")
    episodes = {episode.task_key: episode for episode in Trajectory.objects.filter(run=run)}
    assert sorted(episodes) == sorted(set(keys)) and len(Trajectory.objects.filter(run=run)) == 2
    for episode in Trajectory.objects.filter(run=run):
        assert episode.reward == (1.0 if task_sum(episode.task_key) == a + 2 else 0.0)
        calls = [call["name"] for turn in episode.turns if turn["role"] == "assistant"
                 for call in turn["tool_calls"]]
        assert calls == ["run_python", "submit"]
        tool = next(turn for turn in episode.turns if turn["role"] == "tool")
        assert tool["content"] == TOOL_TEXT.format(a + 2) and tool["result"]["exit_code"] == 0  # the sandbox's
        assert episode.turns[-1]["content"] == str(a + 2)  # the answer submitted, graded
