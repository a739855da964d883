"""Kept prompts (engines/prefix_cache.py): a second turn that continues its first turn's prompt prefills only its
own tokens, and still samples with the logprobs the trainer recomputes; new weights forget what was kept."""

import pytest
import torch

from workers.rl.engines import GenerationRequest
from workers.rl.engines.hf import TransformersEngine
from workers.rl.engines.prefix_cache import MIN_SHARED_TOKENS, PrefixCache, common_length
from workers.rl.engines.sampling import sampling_request
from workers.rl.models.chat_formats import HFChat
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.models.policies import HFPolicy


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    # Grouped attention, as SmolLM2's: a prefill after a kept prompt attends it in place (engines/grouped_attention.py)
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny-hf"), heads=4, kv_heads=2)


def _sample(batch, requests):
    """Admit the requests together and sample them to the end: {request index: (tokens, logprobs) per sample}."""
    refused, _ = batch.admit([(sampling_request(request), index) for index, request in enumerate(requests)])
    assert not refused
    finished = []
    while len(batch):
        finished += batch.advance()
    return {entry["handle"]: list(zip(entry["tokens"], entry["logprobs"], strict=True)) for entry in finished}


def _recomputed(policy, prompt, tokens, temperature):
    ids = torch.tensor([prompt + tokens])
    logprobs, _ = policy.logprobs(ids, torch.ones_like(ids), temperature)
    return logprobs[0, len(prompt) - 1:].tolist()


def test_a_second_turn_prefills_only_what_follows_its_first_turns_prompt(tiny_hf):
    policy = HFPolicy(tiny_hf)
    engine, chat = TransformersEngine(str(tiny_hf)), HFChat(policy.tokenizer)
    try:
        batch = engine._open_batch()
        messages = [{"role": "user", "content": "What is 12 * 13 + 100?"}]
        first = chat.prompt(messages, [])  # the tiny model's context (256) has no room for the tools' instructions
        _sample(batch, [GenerationRequest(first, n=4, max_new_tokens=6, stop_ids=(), seed=1)])
        assert (batch.prefilled_tokens, batch.reused_tokens) == (len(first), 0)

        # Each row's second turn: its call and the tool's answer appended, of different lengths (padded after the
        # kept columns), arriving together.
        seconds = [first + chat.continuation(messages + [{"role": "assistant", "content": call}],
                                             [{"role": "tool", "content": answer}], [])
                   for call, answer in (("print(256)", "256"), ("x", "NameError: x"), ("1", ""))]
        assert len({len(p) for p in seconds}) == 3
        requests = [GenerationRequest(p, n=2, max_new_tokens=5, stop_ids=(), temperature=0.9, seed=5 + i)
                    for i, p in enumerate(seconds)]
        sampled = _sample(batch, requests)
        assert batch.reused_tokens == len(first) * len(seconds)
        assert batch.prefilled_tokens == len(first) + sum(len(p) - len(first) for p in seconds)
        for index, request in enumerate(requests):
            for tokens, logprobs in sampled[index]:
                assert len(tokens) == 5
                assert logprobs == pytest.approx(_recomputed(policy, request.prompt_ids, tokens, 0.9), abs=1e-4)

        # The same requests in a batch that kept nothing sample the same tokens.
        fresh = engine._open_batch()
        assert _sample(fresh, requests).keys() == sampled.keys()
        assert fresh.reused_tokens == 0
        assert {i: [t for t, _ in rows] for i, rows in _sample(engine._open_batch(), requests).items()} == \
            {i: [t for t, _ in rows] for i, rows in sampled.items()}

        # A third turn continues a second turn's prompt, the longest kept.
        third = seconds[0] + chat.tokenizer.encode("256<|im_end|>\n", add_special_tokens=False)
        before = batch.reused_tokens
        _sample(batch, [GenerationRequest(third, n=1, max_new_tokens=2, stop_ids=(), seed=9)])
        assert batch.reused_tokens - before == len(seconds[0])

        unkept = TransformersEngine(str(tiny_hf), keep_prompts=False)  # what bench engine compares against
        try:
            other = unkept._open_batch()
            _sample(other, [GenerationRequest(first, n=1, max_new_tokens=1, stop_ids=(), seed=1)])
            _sample(other, requests)
            assert other.reused_tokens == 0
        finally:
            unkept.close()

        batch.weights_changed()  # kept keys and values belong to the old weights
        before = batch.reused_tokens
        _sample(batch, [GenerationRequest(third, n=1, max_new_tokens=2, stop_ids=(), seed=9)])
        assert batch.reused_tokens == before
    finally:
        engine.close()


def _layers(tokens: int, width: int = 4) -> list:
    return [(torch.zeros(1, 1, tokens, width), torch.zeros(1, 1, tokens, width))]


def test_kept_prompts_are_found_by_their_longest_common_prefix_and_bounded_in_bytes():
    assert common_length([1, 2, 3, 4], (1, 2, 9)) == 2 and common_length([], (1,)) == 0
    long = list(range(100))
    cache = PrefixCache(budget_bytes=3 * 100 * 32)  # three prompts of 100 tokens
    cache.add(long[:50], _layers(50))
    assert cache.longest(long[:50] + [7]) == (50, cache.entries[tuple(long[:50])])
    assert cache.longest(long[:50])[0] == 49  # its last token's logits are the prefill's to compute
    assert cache.longest(long[:MIN_SHARED_TOKENS - 1] + [-1] * 20) == (0, None)  # too short to be worth it
    cache.add(long, _layers(100))  # it extends the kept 50: replaces them
    assert list(cache.entries) == [tuple(long)] and cache.bytes == 100 * 32
    for first in (1000, 2000, 3000):
        cache.add([first] + long[1:], _layers(100))
    assert tuple(long) not in cache.entries and len(cache) == 3 and cache.bytes <= cache.budget_bytes
    cache.longest([1000] + long[1:40])  # used: the least recently used leaves first
    cache.add([4000] + long[1:], _layers(100))
    assert (1000,) + tuple(long[1:]) in cache.entries and (2000,) + tuple(long[1:]) not in cache.entries
