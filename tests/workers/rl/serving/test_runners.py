"""The field's eval runners against `serve`'s app on the tiny a+b model: lm-evaluation-harness (`local-completions` on a
loglikelihood multiple-choice task, `local-chat-completions` on a generate-until task) and Inspect AI (its
OpenAI-compatible provider, on a task with a tool), each on task data shipped in tests/data with nothing downloaded,
and each held to what the studio itself makes of the same model on the same items: greedy answers equal, the choice
lm-evaluation-harness picks from the server's prompt logprobs equal to the one the model's own forward pass prefers.

Marked `runners` (`pytest -m runners` picks them out)."""

import asyncio
import concurrent.futures
import copy
import json

import pytest

from tests.support import ROOT
from tests.support.sandbox import process_pool
from workers.definitions import validate_spec
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.chat_formats import CharChat
from workers.rl.models.policies import TinyLMPolicy
from workers.rl.rollout.choices import choose
from workers.rl.rollout.evaluation import evaluate_batch, suite_tasks
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.rollout.metrics import Prices
from workers.rl.rollout.tools import RUN_PYTHON_TOOL, SandboxToolRunner
from workers.rl.serving.app import build_app
from workers.rl.tasks.taskset import TaskSet
from workers.rl.types import TaskTemplate
from workers.sandbox import SandboxImage
from workers.verifiers import Item

from ..conftest import PLAIN_PYTHON
from .conftest import serving
from .test_openai_conformance import scripted_model

pytestmark = pytest.mark.runners

TASKS = ROOT / "tests" / "data" / "lm_eval"
DOCS = [json.loads(line) for line in (TASKS / "adder.jsonl").read_text().splitlines() if line]
EXACT = validate_spec("verifier", {"layers": [{"name": "exact", "kind": "exact", "checks": [
    {"type": "string_check", "operation": "eq", "reference": "{answer}"}]}]})


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """Nothing from a hub: the runners read only what the repository ships."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.setenv("OPENAI_API_KEY", "unused")


def _harness(model: str, model_args: dict, task: str, **options) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[task], log_samples=True,
                                   task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
                                   bootstrap_iters=0, **options)


def _studio_answers(addition_base_model) -> dict[str, object]:
    """The studio's own evaluation of the model on the documents: the agent loop and the verifier, greedy."""
    template = TaskTemplate.from_spec(
        key="task_template/adder@1", domain="arithmetic", image=PLAIN_PYTHON, verifier_key="verifier/exact@1",
        verifier_spec=EXACT, spec={"prompt_template": "{a}+{b}=", "sandbox_image": "plain-python@1",
                                   "verifier": "exact@1", "limits": {"max_turns": 1, "max_tokens": 4,
                                                                      "max_seconds": 10}})
    items = {str(i): Item(key=str(i), inputs={"a": d["a"], "b": d["b"]}, hidden={"answer": d["answer"]})
             for i, d in enumerate(DOCS)}
    tasks = suite_tasks(TaskSet.single_template(template, items), per_template=0, seed=0)
    engine = TorchEngine(copy.deepcopy(addition_base_model))
    try:
        trajectories = evaluate_batch(tasks, run_id="00000000-0000-4000-8000-0000000000e2", step=1, engine=engine,
                                      chat=CharChat(), tool_runner=None, verifier=LocalVerifier(pool=None),
                                      prices=Prices(), samples=1, temperature=0.0, seed=0, rollout_concurrency=4,
                                      verify_concurrency=4)
    finally:
        engine.close()
    return {t.task_key: t for t in trajectories}


def test_lm_eval_local_completions_chooses_what_the_model_itself_prefers(served, addition_base_model):
    found = _harness("local-completions", {"base_url": f"{served}/completions", "model": "tiny-adder",
                                           "tokenizer_backend": "remote", "batch_size": 6, "max_retries": 1},
                     "adder_choice")
    samples = sorted(found["samples"]["adder_choice"], key=lambda s: s["doc_id"])
    assert len(samples) == len(DOCS)
    policy, tokenizer = TinyLMPolicy(copy.deepcopy(addition_base_model)), CharChat().tokenizer
    studio = [choose(policy, tokenizer.encode(f"{d['a']}+{d['b']}=\x02"), [tokenizer.encode(c) for c in d["choices"]])
              for d in DOCS]
    harness_logprobs = [[float(resp[0]) for resp in s["filtered_resps"]] for s in samples]
    for ours, theirs in zip(studio, harness_logprobs, strict=True):
        assert theirs == pytest.approx(ours.logprobs, abs=1e-4)
    chosen = [max(range(len(lp)), key=lp.__getitem__) for lp in harness_logprobs]
    assert chosen == [c.index for c in studio]
    right = [c.index == d["label"] for c, d in zip(studio, DOCS, strict=True)]
    assert found["results"]["adder_choice"]["acc,none"] == pytest.approx(sum(right) / len(DOCS))
    assert [s["acc"] for s in samples] == [float(r) for r in right]


def test_lm_eval_local_chat_completions_generates_what_the_studio_generates(served, addition_base_model):
    found = _harness("local-chat-completions", {"base_url": f"{served}/chat/completions", "model": "tiny-adder",
                                                "max_retries": 1}, "adder_generate", apply_chat_template=True)
    samples = sorted(found["samples"]["adder_generate"], key=lambda s: s["doc_id"])
    studio = _studio_answers(addition_base_model)
    assert [s["resps"][0][0] for s in samples] == [studio[str(s["doc_id"])].response for s in samples]
    assert [s["exact_match"] for s in samples] == [studio[str(s["doc_id"])].reward for s in samples]
    score = found["results"]["adder_generate"]["exact_match,none"]
    assert score == pytest.approx(sum(t.reward for t in studio.values()) / len(DOCS))
    assert 0 < score < 1  # right some of the time: a score that can differ


def test_the_tokenizer_routes_answer_as_vllms(served):
    import httpx

    root = served.removesuffix("/v1")
    tokens = httpx.post(f"{root}/tokenize", json={"prompt": "3+4=\x02", "add_special_tokens": False}).json()
    chat = CharChat()
    assert tokens["tokens"] == chat.tokenizer.encode("3+4=\x02") and tokens["count"] == 5
    assert httpx.post(f"{root}/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": "3+4=\x02"}
    rendered = httpx.post(f"{root}/tokenize", json={"messages": [{"role": "user", "content": "3+4="}]}).json()
    assert rendered["tokens"] == chat.prompt([{"role": "user", "content": "3+4="}], [])
    info = httpx.get(f"{root}/tokenizer_info").json()
    assert info["eos_token"] == "\x03" and info["bos_token"] is None
    refused = httpx.post(f"{root}/detokenize", json={"tokens": [10**6]})
    assert refused.status_code == 400 and "token ids" in refused.json()["error"]["message"]


# --- Inspect AI --------------------------------------------------------------------------------------------------

QUESTION = "What is 2+3?"
# The call as the server writes a call back into the conversation (chat_completions.chat_messages), so the model's
# own tokens and the server's rendering of the client's replayed turn are the same tokens.
CALL = "\n<tool_call>\n" + json.dumps({"name": "run_python", "arguments": {"code": "print(2+3)"}}) + "\n</tool_call>"
TOOL_IMAGE = SandboxImage(key="sandbox_image/runner-tools@1", layers=({"type": "base", "image": "python-3.11"},),
                          warm_pool_size=1)


@pytest.fixture(scope="module")
def tool_pool():
    with process_pool(TOOL_IMAGE) as pool:
        yield pool


def _tool_model(tool_text: str):
    """A TinyLM scripted by position (test_openai_conformance.scripted_model): asked the question it calls
    run_python; shown the tool's answer it says 5."""
    chat = CharChat()
    question = [{"role": "user", "content": QUESTION}]
    asked = len(chat.prompt(question, []))
    answered = asked + len(chat.tokenizer.encode(CALL)) + 1 + len(chat.continuation(
        question, [{"role": "tool", "content": tool_text}], []))
    return scripted_model({asked: CALL, answered: "5"}, context=256)


@pytest.mark.sandbox  # the tool runs in the studio's sandbox on both sides
def test_inspect_ai_calls_the_tool_through_serve_and_answers_what_the_studio_answers(tool_pool, tmp_path):
    from inspect_ai import Task as InspectTask
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import get_model
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate, use_tools
    from inspect_ai.tool import tool

    runner = SandboxToolRunner(tool_pool)
    tool_text = runner.run(TOOL_IMAGE, "run_python", {"code": "print(2+3)"}).text
    model = _tool_model(tool_text)

    template = TaskTemplate.from_spec(
        key="task_template/tool-adder@1", domain="agents", image=TOOL_IMAGE, verifier_key="verifier/exact@1",
        verifier_spec=EXACT, spec={"prompt_template": "{q}", "sandbox_image": "tool-image@1", "verifier": "exact@1",
                                   "tools": [RUN_PYTHON_TOOL],
                                   "limits": {"max_turns": 3, "max_tokens": 200, "max_seconds": 30}})
    items = {"sum": Item(key="sum", inputs={"q": QUESTION}, hidden={"answer": "5"})}
    engine = TorchEngine(copy.deepcopy(model))
    try:
        [studio] = evaluate_batch(suite_tasks(TaskSet.single_template(template, items), per_template=0, seed=0),
                                  run_id="00000000-0000-4000-8000-0000000000e3", step=1, engine=engine,
                                  chat=CharChat(), tool_runner=runner, verifier=LocalVerifier(pool=None),
                                  prices=Prices(), samples=1, temperature=0.0, seed=0, rollout_concurrency=1,
                                  verify_concurrency=1)
    finally:
        engine.close()
    assert [t.role for t in studio.turns] == ["user", "assistant", "tool", "assistant"]
    assert studio.response == "5" and studio.reward == 1.0

    @tool
    def run_python():
        async def execute(code: str):
            """Run a Python script in the sandbox; returns the exit code, stdout and stderr.

            Args:
                code: the script to run
            """
            return (await asyncio.to_thread(runner.run, TOOL_IMAGE, "run_python", {"code": code})).text

        return execute

    served_engine = TorchEngine(copy.deepcopy(model))
    with serving(build_app(engine=served_engine, chat=CharChat(), model_name="scripted")) as url:
        task = InspectTask(dataset=[Sample(input=QUESTION, target="5")], solver=[use_tools(run_python()), generate()],
                           scorer=match())
        # Inspect runs its own event loop (asyncio.run), which refuses to start in a thread whose loop is running:
        # the suite's browser tests leave Playwright's running in the main thread. A thread of its own, as a script.
        with concurrent.futures.ThreadPoolExecutor(1) as inspect_thread:
            [log] = inspect_thread.submit(
                inspect_eval, task, model=get_model("openai-api/studio/scripted", base_url=url, api_key="unused"),
                log_dir=str(tmp_path / "inspect"), display="none", max_retries=0).result()
    served_engine.close()
    assert log.status == "success", log.error
    [sample] = log.samples
    calls = [call for message in sample.messages if message.role == "assistant" for call in message.tool_calls or []]
    assert [(c.function, c.arguments) for c in calls] == [(t.name, t.arguments) for t in studio.turns[1].tool_calls]
    assert [m.text for m in sample.messages if m.role == "tool"] == [studio.turns[2].content]
    assert sample.output.completion == studio.response
    assert log.results.scores[0].metrics["accuracy"].value == studio.reward
