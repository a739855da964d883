"""Generation on inference servers (workers/rl/engines/server.py): two of the studio's own servers of the tiny
model under uvicorn, the ServerEngine spreading rollouts over them, weight sync through the blob storage, the
policy version of every answer, and the staleness bound."""

import copy
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch
import uvicorn

from workers.egress import EgressPolicy, EgressRefused
from workers.rl.config import ConfigError, GRPOConfig
from workers.rl.engines import GenerationRequest
from workers.rl.engines.server import ServerEngine
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.chat_formats import CharChat
from workers.rl.models.policies import TinyLMPolicy
from workers.rl.protocols import Model
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.serving.app import build_app
from workers.rl.session import build_pipeline
from workers.rl.tasks.taskset import TaskSet
from workers.rl.training.tracking import MemoryTracker
from workers.rl.types import TrajectoryStatus
from workers.storage import Storage

from ..conftest import ITEMS, RUN_ID, addition_template

# The servers these tests start are on the loopback, which the operator allows explicitly (inference servers must
# be listed: tests/security/test_egress.py).
LOOPBACK = EgressPolicy.parse("127.0.0.1")

PROMPTS = ["3+4=", "8+9=", "1+1=", "7+2="]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(engine, **options):
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(engine=engine, chat=CharChat(), model_name="tiny-adder",
                                                     **options), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)

    def stop():
        server.should_exit = True
        thread.join(5)
        engine.close()

    return f"http://127.0.0.1:{port}/v1", stop


@pytest.fixture
def servers(addition_base_model):
    """Two servers of the tiny model; yields their base URLs and engines."""
    engines = [TorchEngine(copy.deepcopy(addition_base_model)) for _ in range(2)]
    started = [_serve(engine) for engine in engines]
    yield [url for url, _ in started], engines
    for _, stop in started:
        stop()


def _requests(max_new_tokens: int = 4) -> list[GenerationRequest]:
    chat = CharChat()
    return [GenerationRequest(chat.prompt([{"role": "user", "content": p}], []), 2, max_new_tokens, chat.stop_ids,
                              temperature=0.0) for p in PROMPTS]


def _local(model) -> list:
    engine = TorchEngine(copy.deepcopy(model))
    try:
        return engine.generate(_requests())
    finally:
        engine.close()


def _same(remote, local) -> None:
    for remote_group, local_group in zip(remote, local, strict=True):
        for r, want in zip(remote_group, local_group, strict=True):
            assert r.token_ids == want.token_ids and r.finish_reason == want.finish_reason
            assert r.logprobs == pytest.approx(want.logprobs, abs=1e-4)


def _changed(model):
    changed = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in changed.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return changed


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def test_generation_on_two_servers_matches_the_in_process_engine_and_follows_weight_syncs(
        servers, addition_base_model, tmp_path):
    urls, engines = servers
    engine = ServerEngine(urls, weights=Storage(tmp_path / "weights"), max_staleness=1, egress=LOOPBACK)
    try:
        before = engine.generate(_requests())
        _same(before, _local(addition_base_model))
        assert all(c.policy_version == 0 and c.compute_seconds >= 0 for group in before for c in group)
        assert all(e.busy_seconds > 0 for e in engines)  # both servers generated

        changed = _changed(addition_base_model)
        engine.load_weights({k: v.clone() for k, v in changed.state_dict().items()}, 1)  # the pipeline's sync
        assert engine.policy_version == 1
        assert [_get(f"{url}/weights")["policy_version"] for url in urls] == [1, 1]
        assert Storage(tmp_path / "weights").published("v-000001")
        after = engine.generate(_requests())
        _same(after, _local(changed))
        assert all(c.policy_version == 1 for group in after for c in group)
        assert [c.token_ids for g in after for c in g] != [c.token_ids for g in before for c in g]

        for version in (2, 3):  # the storage keeps the two newest versions
            engine.load_weights({k: v.clone() for k, v in changed.state_dict().items()}, version)
        assert sorted(Storage(tmp_path / "weights").names()) == ["v-000002", "v-000003"]
    finally:
        engine.close()


def test_chat_answers_carry_their_policy_version_and_token_ids(servers):
    import openai

    urls, _ = servers
    client = openai.OpenAI(base_url=urls[0], api_key="unused")
    reply = client.chat.completions.create(model="tiny-adder", messages=[{"role": "user", "content": "3+4="}],
                                           temperature=0, max_tokens=4, logprobs=True,
                                           extra_body={"return_token_ids": True})
    extra, choice = reply.model_extra, reply.choices[0]
    assert extra["policy_version"] == 0
    assert extra["prompt_token_ids"] == CharChat().prompt([{"role": "user", "content": "3+4="}], [])
    assert len(choice.model_extra["token_ids"]) == len(choice.logprobs.content) == reply.usage.completion_tokens
    chunks = list(client.chat.completions.create(model="tiny-adder", messages=[{"role": "user", "content": "1+1="}],
                                                 temperature=0, max_tokens=4, stream=True))
    assert chunks[-1].model_extra["policy_version"] == 0


def test_an_answer_older_than_the_staleness_bound_is_refused(servers):
    urls, _ = servers  # both serve version 0
    lagging = ServerEngine(urls, max_staleness=1, policy_version=2, retries=1, egress=LOOPBACK)
    within = ServerEngine(urls[:1], max_staleness=2, policy_version=2, egress=LOOPBACK)
    try:
        [group] = lagging.generate(_requests()[:1])
        assert all(c.finish_reason == "error" and "stale" in c.error for c in group)
        assert lagging.stale_refused == 2  # the first answer and its retry on the other server
        [group] = within.generate(_requests()[:1])
        assert all(c.finish_reason == "stop" and c.policy_version == 0 for c in group)
    finally:
        lagging.close()
        within.close()


def test_a_swap_lets_requests_in_flight_finish_on_the_old_weights(addition_base_model, tmp_path):
    served = TorchEngine(copy.deepcopy(addition_base_model))
    url, stop = _serve(served)
    weights = Storage(tmp_path / "weights")
    staging = weights.stage("next")
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in _changed(addition_base_model).state_dict().items()},
              str(staging / "model.safetensors"))
    weights.publish("next", staging)
    engine = ServerEngine([url], egress=LOOPBACK)
    try:
        long = [GenerationRequest([*CharChat().prompt([{"role": "user", "content": "3+4="}], [])], 16, 40, (),
                                  temperature=1.0, seed=3)]
        answers = []
        thread = threading.Thread(target=lambda: answers.append(engine.generate(long)))
        thread.start()
        while served.busy_seconds == 0:  # the long request is being sampled
            time.sleep(0.001)
        engine.sync_weights(weights.url_of("next"), 1)  # one step on: within the bound
        thread.join(30)
        assert {c.policy_version for c in answers[0][0]} == {0}  # finished on the weights it started with ...
        local = TorchEngine(copy.deepcopy(addition_base_model))
        try:  # ... all of it: the same samples as the old weights alone give (each request has its own stream)
            [want] = local.generate(long)
        finally:
            local.close()
        assert [c.token_ids for c in answers[0][0]] == [c.token_ids for c in want]
        assert {c.policy_version for group in engine.generate(_requests()) for c in group} == {1}
    finally:
        engine.close()
        stop()


def test_the_weight_endpoint_needs_its_token_and_refuses_weights_that_do_not_fit(addition_base_model, tmp_path):
    url, stop = _serve(TorchEngine(copy.deepcopy(addition_base_model)), weights_token="s3cret")
    weights = Storage(tmp_path / "weights")
    staging = weights.stage("odd")
    from safetensors.torch import save_file

    save_file({"nothing.weight": torch.zeros(2)}, str(staging / "model.safetensors"))
    weights.publish("odd", staging)

    def post(body: dict, token: str = "") -> tuple[int, dict]:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        request = urllib.request.Request(f"{url}/weights", data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    try:
        body = {"location": weights.url_of("odd"), "policy_version": 1}
        assert post(body)[0] == 401
        assert post(body, "wrong")[0] == 401
        status, answer = post(body, "s3cret")
        assert status == 400 and "do not fit" in answer["error"]["message"]
        assert post({"location": str(tmp_path / "nowhere"), "policy_version": 1}, "s3cret")[0] == 400
        assert _get(f"{url}/weights")["policy_version"] == 0
    finally:
        stop()


def test_an_async_run_trains_on_rollouts_from_the_servers_within_its_staleness_bound(
        servers, addition_base_model, tmp_path):
    urls, _ = servers
    config = GRPOConfig.resolve({
        "groups_per_step": 2, "group_size": 4, "micro_batch_size": 32, "learning_rate": 3e-3,
        "eval_tasks_per_domain": 0, "checkpoint_every": 10, "mode": "async", "max_staleness": 1,
        "rollout_concurrency": 4, "inference_servers": " ".join(urls)})
    engine = ServerEngine(config.server_urls(), weights=Storage(tmp_path / "weights"),
                          max_staleness=config.max_staleness, egress=LOOPBACK)
    tracker = MemoryTracker()
    pipeline = build_pipeline(
        run_id=RUN_ID, config=config, total_steps=3, tasks=TaskSet.single_template(addition_template(), ITEMS),
        model=Model(policy=TinyLMPolicy(copy.deepcopy(addition_base_model)), engine=engine, chat=CharChat()),
        tool_runner=None, verifier=LocalVerifier(pool=None), tracker=tracker, checkpoint_dir=tmp_path / "ckpt")
    try:
        summary = pipeline.run()
    finally:
        engine.close()
    assert summary["steps"] == 3 and summary["staleness"]["max"] <= 1
    assert [_get(f"{url}/weights")["policy_version"] for url in urls] == [3, 3]  # synced after every step
    trained = [t for t in tracker.trajectories.values() if t.effective]
    assert all(0 <= (t.step - 1) - t.policy_version <= 1 for t in trained)
    archived = list(tracker.trajectories.values())
    assert archived and all(t.status != TrajectoryStatus.INFRA_ERROR and t.completion_tokens > 0 for t in archived)
    assert {t.policy_version for t in archived} >= {0, 1}  # rollouts of the synced weights, not the servers' own


def test_a_run_with_inference_servers_gets_the_server_engine(addition_base_model, tmp_path, monkeypatch):
    from workers.rl.models import build

    TinyLMPolicy(copy.deepcopy(addition_base_model)).save_pretrained(tmp_path / "base")
    monkeypatch.setattr(build, "demo_base_model", lambda *args, **kwargs: tmp_path / "base")
    config = GRPOConfig.resolve({"inference_servers": "http://a:1/v1 http://b:1/v1",
                                                    "max_staleness": 2, "device": "cpu"})
    corpus = build.demo_corpus(TaskSet.single_template(addition_template(), ITEMS))
    with pytest.raises(EgressRefused, match="inference server http://a:1/v1"):  # not listed by the operator
        build.build_model(config, corpus, models_dir=tmp_path, pretrain_seconds=0,
                          weights=Storage(tmp_path / "weights"), server_token="t")
    model = build.build_model(config, corpus, models_dir=tmp_path, pretrain_seconds=0,
                              weights=Storage(tmp_path / "weights"), server_token="t",
                              egress=EgressPolicy.parse("a b"))
    try:
        assert isinstance(model.engine, ServerEngine) and not model.engine.shares_weights
        assert model.engine.urls == ["http://a:1/v1", "http://b:1/v1"] and model.engine.max_staleness == 2
        assert model.engine.max_context == addition_base_model.config.block_size
    finally:
        model.close()
    evaluation = build.build_model(config, corpus, models_dir=tmp_path, pretrain_seconds=0)  # no weights storage
    try:
        assert isinstance(evaluation.engine, TorchEngine)
    finally:
        evaluation.close()


def test_the_config_names_the_servers():
    config = GRPOConfig.resolve({"inference_servers": "http://a:8100/v1, http://b:8100/v1"})
    assert config.server_urls() == ["http://a:8100/v1", "http://b:8100/v1"]
    assert GRPOConfig().server_urls() == []
    with pytest.raises(ConfigError, match="inference_servers"):
        GRPOConfig.resolve({"inference_servers": "ftp://a"})


def test_an_api_token_guards_every_generation_route(addition_base_model):
    url, stop = _serve(TorchEngine(copy.deepcopy(addition_base_model)), api_token="s3cret")
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 2}).encode()
    try:
        for path, data in (("completions", body), ("chat/completions", body), ("models", None)):
            request = urllib.request.Request(f"{url}/{path}", data=data, headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == 401, path
        engine = ServerEngine([url], token="s3cret", egress=LOOPBACK)  # the engine sends its token with every request
        try:
            [group] = engine.generate(_requests()[:1])
            assert all(c.finish_reason == "stop" for c in group)
        finally:
            engine.close()
    finally:
        stop()


def test_the_ranks_engine_spreads_generation_over_rank_0s_engine_and_the_followers(addition_base_model):
    """Rank 0's own engine asked directly, a follower's through its server (as workers/rl/training/distributed.py wires
    them under torchrun); after an update each holds the new weights and every answer says so."""
    from workers.rl.engines.ranks import RanksEngine

    local, follower = TorchEngine(copy.deepcopy(addition_base_model)), TorchEngine(copy.deepcopy(addition_base_model))
    url, stop = _serve(follower, api_token="run-token")
    engine = RanksEngine(local, [url], token="run-token", max_staleness=0, max_concurrency=8)
    try:
        before = engine.generate(_requests() * 3)
        _same(before, _local(addition_base_model) * 3)
        assert all(count > 0 for count in engine.completions_by_rank().values()), engine.completions_by_rank()
        assert sum(engine.completions_by_rank().values()) == 24

        changed = _changed(addition_base_model)
        follower.load_weights({k: v.clone() for k, v in changed.state_dict().items()}, 1)  # the follower's own
        engine.load_weights({k: v.clone() for k, v in changed.state_dict().items()}, 1)  # rank 0's, after a step
        after = engine.generate(_requests() * 3)
        _same(after, _local(changed) * 3)
        assert all(c.policy_version == 1 for group in after for c in group)
        assert engine.stale_refused == 0
    finally:
        engine.close()
        local.close()
        stop()


def test_a_followers_server_listens_on_the_loopback_when_every_rank_is_on_this_host():
    from workers.rl.training.distributed import Topology, serving_address

    topology = Topology(rank=1, world_size=4, local_rank=1, backend="gloo")
    assert serving_address(topology, {"LOCAL_WORLD_SIZE": "4"}) == ("127.0.0.1", "127.0.0.1")
    bind, host = serving_address(topology, {"LOCAL_WORLD_SIZE": "2"})  # two nodes
    assert bind == "0.0.0.0" and host == socket.getfqdn()
    assert serving_address(topology, {"LOCAL_WORLD_SIZE": "2", "STUDIO_RANK_ADDRESS": "10.0.0.7"}) == \
        ("0.0.0.0", "10.0.0.7")
