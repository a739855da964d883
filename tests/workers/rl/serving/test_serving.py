"""`serve`'s OpenAI-compatible server on the studio's engine, spoken to by the official `openai` client over real
HTTP; an evaluation through it scores what an evaluation of the model itself scores (greedy: identically); an
endpoint that fails is an infrastructure error, never a wrong answer."""

import copy
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from workers.egress import EgressPolicy
from workers.rl.engines import GenerationRequest
from workers.rl.engines.endpoint import EndpointEngine, MessagesChat, openai_messages
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.chat_formats import CharChat
from workers.rl.rollout.evaluation import evaluate_batch, suite_tasks
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.rollout.metrics import Prices
from workers.rl.tasks.taskset import TaskSet
from workers.rl.types import TrajectoryStatus

from ..conftest import ITEMS, addition_template

LOOPBACK = EgressPolicy.parse("127.0.0.1")  # the servers here are on the loopback, which these tests allow


def test_the_openai_client_gets_models_chat_streams_logprobs_and_completions(served):
    client = openai.OpenAI(base_url=served, api_key="unused")
    assert [m.id for m in client.models.list()] == ["tiny-adder"]
    reply = client.chat.completions.create(model="tiny-adder", messages=[{"role": "user", "content": "3+4="}],
                                           temperature=0, max_tokens=4, logprobs=True, n=2)
    first, second = reply.choices
    assert first.message.content == second.message.content  # greedy: both samples are the argmax
    assert first.message.content.strip() and reply.usage.completion_tokens > 0
    tokens = first.logprobs.content
    assert "".join(t.token for t in tokens).startswith(first.message.content)
    assert all(t.logprob <= 0 for t in tokens)
    chunks = list(client.chat.completions.create(model="tiny-adder", messages=[{"role": "user", "content": "8+9="}],
                                                 temperature=0, max_tokens=4, stream=True))
    whole = client.chat.completions.create(model="tiny-adder", messages=[{"role": "user", "content": "8+9="}],
                                           temperature=0, max_tokens=4).choices[0].message.content
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == whole
    assert len(pieces) == len(whole)  # a character-level model: one chunk per token, sent as it is sampled
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    text = client.completions.create(model="tiny-adder", prompt="3+4=", max_tokens=3, temperature=0, logprobs=0)
    assert len(text.choices[0].logprobs.token_logprobs) == text.usage.completion_tokens
    with pytest.raises(openai.NotFoundError, match="serves 'tiny-adder'"):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="temperature must be from 0 to 2"):
        client.chat.completions.create(model="tiny-adder", messages=[{"role": "user", "content": "hi"}],
                                       temperature=7)


def test_an_evaluation_through_the_server_scores_what_the_model_scores(served, addition_base_model):
    tasks = suite_tasks(TaskSet.single_template(addition_template(), ITEMS), per_template=24, seed=3)
    common = {"run_id": "00000000-0000-4000-8000-0000000000e1", "step": 1, "tool_runner": None,
              "verifier": LocalVerifier(pool=None), "prices": Prices(), "samples": 1, "temperature": 0.0, "seed": 0,
              "rollout_concurrency": 4, "verify_concurrency": 4}
    direct_engine = TorchEngine(copy.deepcopy(addition_base_model))
    direct = evaluate_batch(tasks, engine=direct_engine, chat=CharChat(), **common)
    direct_engine.close()
    endpoint = EndpointEngine(base_url=served, model="tiny-adder", egress=LOOPBACK)
    remote = evaluate_batch(tasks, engine=endpoint, chat=MessagesChat(), **common)
    endpoint.close()
    assert [t.turns[-1].content for t in remote] == [t.turns[-1].content for t in direct]
    assert [t.reward for t in remote] == [t.reward for t in direct]
    assert 0 < sum(t.reward for t in direct) < len(direct)  # right some of the time: a score that can differ


class _Failing(BaseHTTPRequestHandler):
    """Answers every completion with the failure its path names: 500, 429, not JSON, or too late."""

    calls: list[str] = []

    def do_POST(self):  # noqa: N802 -- http.server's name
        mode = self.path.split("/")[1]
        type(self).calls.append(mode)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if mode == "slow":
            time.sleep(2)
        status, body = {"error500": (500, b'{"error": {"message": "boom"}}'),
                        "ratelimited": (429, b'{"error": {"message": "slow down"}}'),
                        "notjson": (200, b"<html>a proxy page</html>"), "slow": (200, b"{}")}[mode]
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if mode != "notjson" else "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # "slow": the client gave up waiting, as it should
            pass

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("mode", ["error500", "ratelimited", "notjson", "slow"])
def test_a_failing_endpoint_is_retried_then_an_infrastructure_error(mode):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Failing.calls = []
    try:
        engine = EndpointEngine(base_url=f"http://127.0.0.1:{server.server_port}/{mode}/v1", model="m",
                                timeout_seconds=0.5, client_retries=1, retries=1, egress=LOOPBACK)
        tasks = suite_tasks(TaskSet.single_template(addition_template(), ITEMS), per_template=2, seed=0)
        rows = evaluate_batch(tasks, run_id="00000000-0000-4000-8000-0000000000e2", step=1, engine=engine,
                              chat=MessagesChat(), tool_runner=None, verifier=LocalVerifier(pool=None),
                              prices=Prices(), samples=1, temperature=0.0, seed=0, rollout_concurrency=2,
                              verify_concurrency=2)
        engine.close()
    finally:
        server.shutdown()
    assert [t.status for t in rows] == [TrajectoryStatus.INFRA_ERROR] * 2
    assert all(t.reward is None for t in rows)  # never scored: not a wrong answer
    assert all("the engine gave no answer" in t.status_reason for t in rows)
    assert len(_Failing.calls) >= 2 * 2, (_Failing.calls, [t.status_reason for t in rows])  # each tried again


def test_tool_calls_travel_as_the_api_expects():
    messages = [{"role": "user", "content": "sum"},
                {"role": "assistant", "content": 'Let me run it.\n<tool_call>{"name": "run_python", '
                                                 '"arguments": {"code": "print(1)"}}</tool_call>'},
                {"role": "tool", "content": "1", "tool_call_id": "call-0-0", "name": "run_python"}]
    sent = openai_messages(messages)
    assert sent[1]["tool_calls"] == [{"id": "call-0-0", "type": "function", "function": {
        "name": "run_python", "arguments": json.dumps({"code": "print(1)"})}}]
    assert sent[2] == {"role": "tool", "tool_call_id": "call-0-0", "content": "1"}


class _WindowsModel(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint whose model writes "\\r\\n": every chat completion is the same two lines."""

    def do_POST(self):  # noqa: N802 -- http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "m", "choices": [
            {"index": 0, "finish_reason": "stop",
             "message": {"role": "assistant", "content": "Adding them:\r\nAnswer: 5\r\n"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_an_endpoints_answer_is_read_with_newlines():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _WindowsModel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        engine = EndpointEngine(base_url=f"http://127.0.0.1:{server.server_port}/v1", model="m", egress=LOOPBACK)
        [[completion]] = engine.generate([GenerationRequest(prompt_ids=[], n=1, max_new_tokens=16, stop_ids=(),
                                                            messages=({"role": "user", "content": "2 + 3?"},))])
        engine.close()
    finally:
        server.shutdown()
    assert completion.text == "Adding them:\nAnswer: 5\n"
