"""The vLLM launcher's own parts, without vLLM (GPU-only; deploy/gpu/check_vllm.sh runs the whole on a GPU): the
names the trainer publishes are the checkpoint names vLLM loads, the fit check, the auth rule, our flags, and the
weight route plus policy-version middleware on a small real Starlette app under uvicorn, spoken to over HTTP: a
swap waits for the completion in flight and holds the next one, each answer (JSON or stream) says the version
that served it, and a failed load stops completions until a load succeeds."""

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import uvicorn
from safetensors import safe_open
from safetensors.torch import save_file
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.models.policies import HFPolicy
from workers.rl.serving import vllm_server
from workers.rl.serving.vllm_server import (
    EXTENSION,
    ServedWeights,
    check_extension,
    check_fits,
    checkpoint_name,
    checkpoint_names,
    checkpoint_shapes,
    install,
    safetensors_shapes,
    split_args,
    with_policy_version_event,
)
from workers.rl.serving.weight_sync import BadRequest, may_load
from workers.rl.serving.weights import read_weights
from workers.storage import Storage


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny-hf"), hidden_size=32, layers=1, heads=2,
                              max_positions=64)


# --- names and the fit check ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("lora_rank", [0, 2])
def test_the_trainer_publishes_the_checkpoint_names_vllm_loads(tiny_hf, tmp_path, lora_rank):
    policy = HFPolicy(str(tiny_hf), lora_rank=lora_rank)
    state = policy.inference_state()
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    published = safetensors_shapes(tmp_path / "model.safetensors")
    served = checkpoint_shapes(str(tiny_hf))
    assert published == served  # names and shapes: exactly the checkpoint's, LoRA merged in
    assert all(checkpoint_name(name) == name for name in published)  # nothing to map
    check_fits(published, served)


def test_wrapped_names_map_to_checkpoint_names_and_adapters_are_left_out(tiny_hf):
    policy = HFPolicy(str(tiny_hf), lora_rank=2)
    raw = {name: tuple(value.shape) for name, value in policy.model.state_dict().items()}  # PEFT's own names
    assert any(name.startswith("base_model.model.") for name in raw) and any("lora_A" in name for name in raw)
    mapped = checkpoint_names(raw)
    assert sorted(mapped.values()) == sorted(checkpoint_shapes(str(tiny_hf)))
    check_fits(raw, checkpoint_shapes(str(tiny_hf)))
    assert checkpoint_name("_orig_mod.model.norm.weight") == "model.norm.weight"
    with pytest.raises(ValueError, match="both"):
        checkpoint_names(["model.norm.weight", "base_model.model.model.norm.weight"])


def test_the_fit_check_refuses_what_vllm_would_half_load():
    served = {"model.embed_tokens.weight": (10, 4), "model.norm.weight": (4,), "model.rotary_emb.inv_freq": (2,)}
    check_fits({"model.embed_tokens.weight": (10, 4), "model.norm.weight": (4,), "lm_head.weight": (10, 4)},
               served)  # a tied head the trainer publishes, an old rotary cache it does not
    with pytest.raises(BadRequest, match=r"missing \['model.norm.weight'\]"):
        check_fits({"model.embed_tokens.weight": (10, 4)}, served)
    with pytest.raises(BadRequest, match=r"unexpected \['embed_tokens.weight'\]"):
        check_fits({"embed_tokens.weight": (10, 4), "model.norm.weight": (4,), "model.embed_tokens.weight": (10, 4)},
                   served)
    with pytest.raises(BadRequest, match=r"other shapes \['model.norm.weight'\]"):
        check_fits({"model.embed_tokens.weight": (10, 4), "model.norm.weight": (5,)}, served)
    with pytest.raises(BadRequest, match="no tensor"):
        check_fits({"x.lora_A.weight": (2, 2)}, None)
    check_fits({"anything.weight": (1,)}, None)  # no local checkpoint to compare with: vLLM's loader checks


def test_shapes_come_from_the_header_alone(tmp_path):
    tensors = {"a": torch.zeros(3, 5), "b.c": torch.zeros(7, dtype=torch.bfloat16), "d": torch.zeros(())}
    save_file(tensors, str(tmp_path / "x.safetensors"), metadata={"format": "pt"})
    with safe_open(str(tmp_path / "x.safetensors"), "pt") as file:
        expected = {name: tuple(file.get_slice(name).get_shape()) for name in file.keys()}
    assert safetensors_shapes(tmp_path / "x.safetensors") == expected == {"a": (3, 5), "b.c": (7,), "d": ()}
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError):
        safetensors_shapes(tmp_path / "bad.safetensors")
    assert checkpoint_shapes(str(tmp_path / "nowhere")) is None and checkpoint_shapes("Qwen/Qwen3-0.6B") is None


# --- auth and flags --------------------------------------------------------------------------------------------------

def test_the_auth_rule_is_the_studio_servers():
    assert may_load("", "127.0.0.1", "") and may_load("", "::1", "")
    assert not may_load("", "10.0.0.7", "") and not may_load("", None, "")
    assert may_load("Bearer s3cret", "10.0.0.7", "s3cret")
    assert not may_load("Bearer wrong", "127.0.0.1", "s3cret") and not may_load("", "127.0.0.1", "s3cret")
    assert not may_load("s3cret", "10.0.0.7", "s3cret")


def test_our_flags_are_taken_and_vllms_are_left_for_its_parser():
    studio, rest = split_args(["--model", "/m", "--policy-version", "7", "--tensor-parallel-size", "2",
                               "--logprobs-mode=raw_logprobs", "--api-key", "k"])
    assert studio.policy_version == 7
    assert rest == ["--model", "/m", "--tensor-parallel-size", "2", "--logprobs-mode=raw_logprobs", "--api-key", "k"]
    assert split_args(["/m", "--policy-version=3"])[0].policy_version == 3
    assert split_args(["--model", "/m"])[0].policy_version == 0
    studio, rest = split_args(["--policy", "4", "--model", "/m"])  # no abbreviations: that one is vLLM's to judge
    assert studio.policy_version == 0 and rest[:2] == ["--policy", "4"]
    with pytest.raises(SystemExit):
        split_args(["--policy-version", "-1"])
    assert vllm_server.VLLM_DEFAULTS == {"logprobs_mode": "processed_logprobs", "worker_extension_cls": EXTENSION}


def test_the_worker_extension_must_be_ours():
    check_extension(EXTENSION)
    module, _, name = EXTENSION.rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) is vllm_server.StudioWorkerExtension
    with pytest.raises(SystemExit, match="subclass"):
        check_extension("workers.rl.serving.weight_sync.BadRequest")
    with pytest.raises(SystemExit):
        check_extension("no_such_module.Extension")


def test_stream_events_get_the_version_and_done_stays():
    event = b'data: {"id":"c","choices":[{"index":0,"text":"hi"}]}'
    assert json.loads(with_policy_version_event(event, 4)[6:]) == {"id": "c", "choices": [{"index": 0, "text": "hi"}],
                                                                   "policy_version": 4}
    assert with_policy_version_event(b"data: [DONE]", 4) == b"data: [DONE]"
    assert with_policy_version_event(b": keep-alive", 4) == b": keep-alive"


# --- the route and the middleware on a real app over HTTP ---------------------------------------------------------

class TinyModel:
    """A stand-in app behind the middleware: answers completions with the sum of its one weight, which `swap` loads
    from the published directory with the studio's own reader. A completion can be held in flight."""

    def __init__(self):
        self.weight = 0.0
        self.arrived = 0
        self.hold = threading.Event()
        self.hold.set()
        self.loaded: list[tuple[str, int]] = []
        self.fail_next = False

    async def swap(self, directory, version):
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the device fell over")
        self.weight = float(read_weights(str(directory))["model.w"].sum())
        self.loaded.append((str(directory), version))

    async def completions(self, request):
        body = await request.json()
        self.arrived += 1
        if body.get("prompt") == "bad":
            return JSONResponse({"error": {"message": "no"}}, status_code=400)
        await asyncio.to_thread(self.hold.wait, 10)
        return JSONResponse({"object": "text_completion", "choices": [{"index": 0, "text": str(self.weight)}]})

    async def chat(self, request):
        await request.json()
        self.arrived += 1

        async def events():
            for piece in ("a", "b"):
                yield f'data: {json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]})}\n\n'
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture
def server(tmp_path, request):
    """The tiny app with `install`'s route and middleware under uvicorn in a thread; yields (base URL, model,
    storage to publish to)."""
    token = getattr(request, "param", "")
    model = TinyModel()
    app = Starlette(routes=[Route("/v1/completions", model.completions, methods=["POST"]),
                            Route("/v1/chat/completions", model.chat, methods=["POST"]),
                            Route("/v1/models", lambda r: JSONResponse({"data": []}))])
    install(app, weights=ServedWeights(0, "tiny"), swap=model.swap, token=token, served={"model.w": (2, 2)})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", model, Storage(tmp_path / "weights")
    model.hold.set()
    uv.should_exit = True
    thread.join(5)


def call(url, body=None, token="") -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=20) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def publish(storage: Storage, version: int, value: float, shape=(2, 2)) -> str:
    key = f"v-{version:06d}"
    staging = storage.stage(key)
    save_file({"model.w": torch.full(shape, value)}, str(staging / "model.safetensors"))
    storage.publish(key, staging, policy_version=version)
    return storage.url_of(key)


def test_a_swap_waits_for_the_completion_in_flight_and_holds_the_next(server):
    base, model, storage = server
    assert call(f"{base}/weights") == (200, {"model": "tiny", "policy_version": 0})
    location = publish(storage, 1, 0.5)
    model.hold.clear()
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(call, f"{base}/completions", {"prompt": [1, 2]})
        while model.arrived < 1:
            time.sleep(0.01)
        swap = pool.submit(call, f"{base}/weights", {"location": location, "policy_version": 1})
        time.sleep(0.3)
        assert not model.loaded and not swap.done()  # waiting for the completion in flight
        second = pool.submit(call, f"{base}/completions", {"prompt": [3]})
        time.sleep(0.3)
        assert model.arrived == 1  # held at the gate, not sent to the model during the swap
        model.hold.set()
        status, answer = first.result()
        assert (status, answer["choices"][0]["text"], answer["policy_version"]) == (200, "0.0", 0)
        status, loaded = swap.result()
        assert status == 200 and loaded["policy_version"] == 1 and loaded["paused_seconds"] >= 0.3
        status, answer = second.result()
        assert (status, answer["choices"][0]["text"], answer["policy_version"]) == (200, "2.0", 1)
    assert model.loaded == [(location, 1)]
    assert call(f"{base}/weights")[1]["policy_version"] == 1
    status, answer = call(f"{base}/completions", {"prompt": "bad"})  # not an answer: left as the app wrote it
    assert status == 400 and "policy_version" not in answer
    assert "policy_version" not in call(f"{base}/models")[1]


def test_each_chunk_of_a_stream_says_its_version(server):
    base, model, storage = server
    call(f"{base}/weights", {"location": publish(storage, 5, 1.0), "policy_version": 5})
    request = urllib.request.Request(f"{base}/chat/completions", data=b'{"stream": true}',
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=20) as reply:
        events = [e for e in reply.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["a", "b"]
    assert all(c["policy_version"] == 5 for c in chunks)


def test_bad_loads_are_refused_before_anything_pauses(server, tmp_path):
    base, model, storage = server
    assert call(f"{base}/weights", {"policy_version": 1})[0] == 400
    assert call(f"{base}/weights", {"location": publish(storage, 1, 1.0), "policy_version": -1})[0] == 400
    (tmp_path / "empty").mkdir()
    status, answer = call(f"{base}/weights", {"location": str(tmp_path / "empty"), "policy_version": 1})
    assert status == 400 and "no model.safetensors" in answer["error"]["message"]
    status, answer = call(f"{base}/weights", {"location": str(tmp_path / "absent"), "policy_version": 1})
    assert status == 400
    status, answer = call(f"{base}/weights", {"location": publish(storage, 2, 1.0, shape=(3,)), "policy_version": 2})
    assert status == 400 and "other shapes ['model.w']" in answer["error"]["message"]
    assert not model.loaded and call(f"{base}/weights")[1]["policy_version"] == 0


def test_a_failed_load_stops_completions_until_one_succeeds(server):
    base, model, storage = server
    model.fail_next = True
    status, answer = call(f"{base}/weights", {"location": publish(storage, 1, 1.0), "policy_version": 1})
    assert status == 500 and "the device fell over" in answer["error"]["message"]
    status, answer = call(f"{base}/completions", {"prompt": [1]})
    assert status == 503 and "refuses completions" in answer["error"]["message"]
    assert call(f"{base}/weights")[1]["policy_version"] == 0
    assert call(f"{base}/weights", {"location": publish(storage, 2, 0.25), "policy_version": 2})[0] == 200
    status, answer = call(f"{base}/completions", {"prompt": [1]})
    assert (status, answer["choices"][0]["text"], answer["policy_version"]) == (200, "1.0", 2)


@pytest.mark.parametrize("server", ["s3cret"], indirect=True)
def test_with_a_token_loading_needs_it(server):
    base, model, storage = server
    location = publish(storage, 1, 1.0)
    status, answer = call(f"{base}/weights", {"location": location, "policy_version": 1})
    assert status == 401 and "bearer token" in answer["error"]["message"]
    assert call(f"{base}/weights", {"location": location, "policy_version": 1}, token="wrong")[0] == 401
    assert call(f"{base}/weights", {"location": location, "policy_version": 1}, token="s3cret")[0] == 200
    assert model.loaded == [(location, 1)]
