"""Inference engines: the logprobs they report are the ones the trainer recomputes, seeds fix the samples, and
new weights arrive without a restart (LoRA adapters merged under the base model's names)."""

import copy
import threading
import time

import pytest
import torch

from workers.definitions.specs import ToolSpec
from workers.rl.engines import GenerationRequest
from workers.rl.engines.hf import TransformersEngine
from workers.rl.engines.sampling import SamplingRequest
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.chat_formats import CharChat, HFChat
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.models.policies import HFPolicy, TinyLMPolicy
from workers.rl.rollout.tools import RUN_PYTHON_TOOL, parse_tool_calls


def _recomputed(policy, prompt, completion, temperature):
    ids = torch.tensor([prompt + completion.token_ids])
    logprobs, _ = policy.logprobs(ids, torch.ones_like(ids), temperature)
    return logprobs[0, len(prompt) - 1:].tolist()


def test_torch_engine_reports_the_logprobs_the_trainer_recomputes(addition_base_model):
    policy = TinyLMPolicy(copy.deepcopy(addition_base_model))
    engine, chat = TorchEngine(policy.model), CharChat()
    prompt = chat.prompt([{"role": "user", "content": "3+4="}], [])
    request = GenerationRequest(prompt, n=6, max_new_tokens=4, stop_ids=chat.stop_ids, temperature=0.7, seed=11)
    [group] = engine.generate([request])
    assert len(group) == 6
    for completion in group:
        assert completion.finish_reason in ("stop", "length") and len(completion.token_ids) <= 4
        assert completion.logprobs == pytest.approx(_recomputed(policy, prompt, completion, 0.7), abs=1e-4)
    [again] = engine.generate([request])
    assert [c.token_ids for c in again] == [c.token_ids for c in group]


def test_torch_engine_takes_new_weights_in_place(addition_base_model):
    policy = TinyLMPolicy(copy.deepcopy(addition_base_model))
    engine, chat = TorchEngine(policy.model), CharChat()
    prompt = chat.prompt([{"role": "user", "content": "3+4="}], [])
    request = GenerationRequest(prompt, n=1, max_new_tokens=4, stop_ids=chat.stop_ids, seed=1)
    before = engine.generate([request])[0][0]
    with torch.no_grad():
        for parameter in policy.model.parameters():
            parameter.mul_(0.5)
    assert engine.generate([request])[0][0].logprobs == before.logprobs  # the engine keeps its own copy
    engine.load_weights(policy.inference_state(), version=7)
    after = engine.generate([request])[0][0]
    assert engine.policy_version == 7
    assert after.logprobs == pytest.approx(_recomputed(policy, prompt, after, 1.0), abs=1e-4)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny-hf"))


def test_transformers_engine_loads_by_local_path_and_matches_the_policy(tiny_hf):
    policy = HFPolicy(tiny_hf)
    engine, chat = TransformersEngine(str(tiny_hf)), HFChat(policy.tokenizer)
    prompt = chat.prompt([{"role": "user", "content": "12+7="}], [])
    request = GenerationRequest(prompt, n=4, max_new_tokens=6, stop_ids=chat.stop_ids, temperature=0.9, seed=3)
    [group] = engine.generate([request])
    for completion in group:
        assert completion.logprobs == pytest.approx(_recomputed(policy, prompt, completion, 0.9), abs=1e-4)
    assert [c.token_ids for c in engine.generate([request])[0]] == [c.token_ids for c in group]
    with pytest.raises(FileNotFoundError, match="local path"):
        TransformersEngine(str(tiny_hf / "missing"))


def test_lora_weights_reach_the_engine_merged_under_the_base_names(tiny_hf):
    policy = HFPolicy(tiny_hf, lora_rank=4)
    with torch.no_grad():  # a trained adapter: lora_B starts at zero, which would merge to nothing
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    engine, chat = TransformersEngine(str(tiny_hf)), HFChat(policy.tokenizer)
    prompt = chat.prompt([{"role": "user", "content": "2+2="}], [])
    request = GenerationRequest(prompt, n=2, max_new_tokens=5, stop_ids=chat.stop_ids, seed=4)
    stale = engine.generate([request])[0][0]
    assert stale.logprobs != pytest.approx(_recomputed(policy, prompt, stale, 1.0), abs=1e-3)
    engine.load_weights(policy.inference_state(), version=1)
    for completion in engine.generate([request])[0]:
        assert completion.logprobs == pytest.approx(_recomputed(policy, prompt, completion, 1.0), abs=1e-4)
    # Unmerged again afterwards: the trainer's own model still has separate adapters.
    assert any("lora_A" in name for name, _ in policy.model.named_parameters())


def test_the_lora_merged_state_is_peft_merges_bit_for_bit_and_leaves_the_trainers_weights_untouched(tiny_hf):
    """inference_state sums base + PEFT's delta itself instead of merging into the trainer's weights and out again:
    the same numbers as PEFT's merge, and the base weights exactly as they were ((W + d) - d is not W)."""
    policy = HFPolicy(tiny_hf, lora_rank=4)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    before = {name: value.clone() for name, value in policy.model.state_dict().items()}
    state = policy.inference_state()
    assert all(torch.equal(value, before[name]) for name, value in policy.model.state_dict().items())
    merged = copy.deepcopy(policy.model)
    merged.merge_adapter()
    expected = {key.removeprefix("base_model.model.").replace(".base_layer", ""): value
                for key, value in merged.state_dict().items() if "lora_" not in key}
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[name], expected[name]) for name in expected)
    base = next(key for key in before if key.endswith("q_proj.base_layer.weight"))
    assert not torch.equal(state[base.removeprefix("base_model.model.").replace(".base_layer", "")], before[base])


def test_an_engine_sharing_the_trainers_model_samples_each_update_without_a_copy(tiny_hf):
    """A sync run's engine: the trainer's own model; a new version carries no weights, and what it samples
    after an update is what the trainer recomputes (in eval mode: the trainer leaves it in training mode)."""
    policy = HFPolicy(tiny_hf)
    engine, chat = TransformersEngine(str(tiny_hf), shared_model=policy.model), HFChat(policy.tokenizer)
    assert engine.shares_weights and engine.model is policy.model
    prompt = chat.prompt([{"role": "user", "content": "12+7="}], [])
    request = GenerationRequest(prompt, n=4, max_new_tokens=6, stop_ids=chat.stop_ids, temperature=0.9, seed=3)
    before = engine.generate([request])[0]
    policy.train()  # as the trainer does, then it updates the weights in place
    with torch.no_grad():
        for parameter in policy.model.parameters():
            parameter.mul_(0.5)
    engine.load_weights(None, version=3)
    after = engine.generate([request])[0]
    assert engine.policy_version == 3 and not policy.model.training
    assert [c.logprobs for c in after] != [c.logprobs for c in before]
    for completion in after:
        assert completion.logprobs == pytest.approx(_recomputed(policy, prompt, completion, 0.9), abs=1e-4)
    engine.close()


def test_the_hf_chat_format_appends_tool_results_by_ids(tiny_hf):
    chat = HFChat(HFPolicy(tiny_hf).tokenizer)
    messages = [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]
    ids = chat.continuation(messages, [{"role": "tool", "content": "ok"}], [])
    assert chat.tokenizer.decode(ids) == "<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n"
    assert chat.tokenizer.convert_tokens_to_ids("<|im_end|>") in chat.stop_ids


def test_batched_sampling_of_prompts_of_different_lengths_reports_true_logprobs(addition_base_model):
    """Left padding, per-row positions and rows leaving the batch must not change what each row computes."""
    policy = TinyLMPolicy(copy.deepcopy(addition_base_model))
    engine, chat = TorchEngine(policy.model), CharChat()
    prompts = [chat.prompt([{"role": "user", "content": text}], []) for text in ("3+4=", "12+7=", "9+9=?!")]
    requests = [GenerationRequest(p, n=3, max_new_tokens=5, stop_ids=chat.stop_ids, seed=i)
                for i, p in enumerate(prompts)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as callers:  # three rollout threads at once: one batch
        results = list(callers.map(lambda r: engine.generate([r])[0], requests))
    for prompt, group in zip(prompts, results, strict=True):
        assert len(group) == 3
        for completion in group:
            assert completion.logprobs == pytest.approx(_recomputed(policy, prompt, completion, 1.0), abs=1e-4)
            assert completion.compute_seconds > 0 or not completion.token_ids
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate(requests[:1])


def test_a_row_that_fills_the_context_stops_there_while_others_go_on(addition_base_model):
    engine, chat = TorchEngine(copy.deepcopy(addition_base_model)), CharChat()
    context = engine.max_context
    long_prompt = [chat.tokenizer.id_of("1")] * (context - 3)
    short = GenerationRequest(chat.prompt([{"role": "user", "content": "3+4="}], []), n=2, max_new_tokens=20,
                              stop_ids=(), seed=1)
    full = GenerationRequest(long_prompt, n=2, max_new_tokens=20, stop_ids=(), seed=2)
    short_group, full_group = engine.generate([short, full])
    assert all(len(c.token_ids) == 3 and c.finish_reason == "length" for c in full_group)
    assert all(len(c.token_ids) == 20 for c in short_group)
    engine.close()


def test_the_running_batch_records_no_autograd_history_however_long_it_runs(addition_base_model):
    """An async run's engine batch never drains: rollouts join it between two tokens. Sampled with autograd on,
    each token's cache would hold the graph of every write before it (the embedded demo grew to 13 GB in 15
    minutes). The model's parameters require gradients here, as the trainer's own model's do."""
    model, chat = copy.deepcopy(addition_base_model), CharChat()
    assert all(p.requires_grad for p in model.parameters())
    batch = model.continuous_batch(context=model.config.block_size, device="cpu")
    prompts = [chat.prompt([{"role": "user", "content": text}], []) for text in ("3+4=", "12+7=")]
    batch.admit([(SamplingRequest(prompts[0], n=3, max_new_tokens=30, stops=(), seed=1), "first")])
    for _ in range(4):
        batch.advance()
    batch.admit([(SamplingRequest(prompts[1], n=2, max_new_tokens=2, stops=(), seed=2), "joins")])  # merged in
    finished = [entry["handle"] for _ in range(3) for entry in batch.advance()]
    assert finished == ["joins"] and len(batch) == 3  # its rows left; the first request's go on
    held = [batch.last, *batch.cache.keys, *batch.cache.values]
    assert not any(tensor.requires_grad or tensor.grad_fn is not None for tensor in held)


def test_a_template_without_tools_is_taught_the_call_format_the_studio_parses(tiny_hf):
    """The tiny Llama's template (like SmolLM2's) ignores `tools`: the Hermes instructions go into the system
    message, and a call written in that format is one parse_tool_calls reads."""
    chat = HFChat(HFPolicy(tiny_hf).tokenizer)
    assert not chat.template_takes_tools
    with_system = chat.tokenizer.decode(chat.prompt([{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": "2+2="}], [RUN_PYTHON_TOOL]))
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '"name": "run_python"' in with_system and "<tool_call>" in with_system
    without_system = chat.tokenizer.decode(chat.prompt([{"role": "user", "content": "2+2="}], [RUN_PYTHON_TOOL]))
    assert without_system.startswith("<|im_start|>system\n# Tools")
    assert "# Tools" not in chat.tokenizer.decode(chat.prompt([{"role": "user", "content": "2+2="}], []))
    example = '<tool_call>\n{"name": "run_python", "arguments": {"code": "print(4)"}}\n</tool_call>'
    assert parse_tool_calls(example, [ToolSpec.model_validate(RUN_PYTHON_TOOL)])[0].arguments == {"code": "print(4)"}
    # The instructions are in every rendering, so a tool result still appends only its own ids.
    ids = chat.continuation([{"role": "user", "content": "2+2="}, {"role": "assistant", "content": example}],
                            [{"role": "tool", "content": "4"}], [RUN_PYTHON_TOOL])
    assert chat.tokenizer.decode(ids) == "<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n"


def test_the_transformers_engine_batches_continuously_with_true_logprobs(tiny_hf):
    """Requests of different lengths arriving while others sample join the running batch (the cache rows and
    written into free slots of its slot cache, freed as rows stop); each completion's logprobs are still the ones
    the trainer recomputes, and a short request does not wait for a long one."""
    policy = HFPolicy(tiny_hf)
    engine, chat = TransformersEngine(str(tiny_hf)), HFChat(policy.tokenizer)
    prompts = [chat.prompt([{"role": "user", "content": text}], []) for text in ("1+1=", "12+13=", "7+8= please")]
    long_request = GenerationRequest(prompts[0], n=3, max_new_tokens=200, stop_ids=(), temperature=1.0, seed=1)
    short = [GenerationRequest(prompt, n=2, max_new_tokens=3, stop_ids=(), temperature=0.8, seed=2 + index)
             for index, prompt in enumerate(prompts[1:])]
    results, finished = {}, []

    def ask(key, request):
        results[key] = engine.generate([request])[0]
        finished.append(key)

    threads = [threading.Thread(target=ask, args=("long", long_request))]
    threads[0].start()
    time.sleep(0.05)  # the long request is sampling
    for index, request in enumerate(short):
        threads.append(threading.Thread(target=ask, args=(index, request)))
        threads[-1].start()
    for thread in threads:
        thread.join(timeout=60)
    assert finished[-1] == "long"  # the short ones joined it and left first
    assert [len(c.token_ids) for c in results["long"]] == [200, 200, 200]
    for request, key in [(long_request, "long"), (short[0], 0), (short[1], 1)]:
        for completion in results[key]:
            assert completion.logprobs == pytest.approx(
                _recomputed(policy, request.prompt_ids, completion, request.temperature), abs=1e-4)
    engine.close()


@pytest.mark.parametrize("rows", [
    [("12+7=", "19"), ("12+7=", "20 or 19"), ("12+7=", "1")],  # one GRPO group: one prompt, expanded
    [("12+7=", "19"), ("3+4=", "7"), ("12+7=", "20"), ("3+4=", "8 or 7")],  # two groups, prompts of two lengths
])
def test_a_prompt_the_rows_share_is_computed_once_with_the_same_logprobs_and_gradients(tiny_hf, rows):
    """The trainer's micro-batch: each prompt its rows share goes through the model once (its keys and values
    handed to every row). Logprobs and LoRA gradients must equal those of each row on its own."""
    policy = HFPolicy(tiny_hf, lora_rank=4)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.3)
    chat = HFChat(policy.tokenizer)
    sequences = [chat.prompt([{"role": "user", "content": question}], [])
                 + chat.tokenizer.encode(answer, add_special_tokens=False) for question, answer in rows]
    prompt = min((chat.prompt([{"role": "user", "content": q}], []) for q, _ in rows), key=len)
    answers = [sequence[len(prompt):] for sequence in sequences]  # a longer prompt's tail counts as its answer
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        ids[row, :len(sequence)] = torch.tensor(sequence)
        attention[row, :len(sequence)] = 1
    first = len(prompt) - 1  # the first trained token is ids[:, first + 1]

    def lora_gradients():
        return {name: p.grad.clone() for name, p in policy.model.named_parameters() if p.grad is not None}

    shared, _ = policy.logprobs(ids, attention, 0.8, first)
    (shared * attention[:, first + 1:]).sum().backward()
    shared_gradients = lora_gradients()
    policy.model.zero_grad()
    alone_rows = []
    for row in range(len(answers)):
        alone, _ = policy.logprobs(ids[row:row + 1], attention[row:row + 1], 0.8, first)
        (alone * attention[row:row + 1, first + 1:]).sum().backward()
        alone_rows.append(alone[0])
    assert shared.shape == (len(answers), width - 1 - first)
    real = attention[:, first + 1:].bool()
    assert shared[real].tolist() == pytest.approx(torch.stack(alone_rows)[real].tolist(), abs=1e-5)
    for name, gradient in lora_gradients().items():
        assert torch.allclose(shared_gradients[name], gradient, atol=1e-5), name
    # Answers of one token each: only the prompt's last position predicts, nothing follows it.
    one_token, _ = policy.logprobs(ids[:, :first + 2], attention[:, :first + 2], 0.8, first)
    assert one_token[:, 0].tolist() == pytest.approx(shared[:, 0].tolist(), abs=1e-5)
