"""Speculative decoding from the context (engines/speculation.py): greedy output token for token what plain decoding
gives, on every engine that batches continuously and with rows joining and leaving; sampled output keeping the
model's distribution (a chi-square test that a sampler keeping drafts blindly fails); streaming, stop ids, stop
checks and penalties as without it; the acceptance counted where the engine's stats are."""

import contextlib
import copy
import itertools

import pytest
import torch
from prometheus_client import REGISTRY
from scipy.stats import chisquare

from workers.rl.engines import GenerationRequest
from workers.rl.engines.hf import TransformersEngine
from workers.rl.engines.sampling import SamplingRequest
from workers.rl.engines.speculation import OFF, NgramIndex, Speculation, propose
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.chat_formats import CharChat
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.models.tiny_lm import ModelConfig, TinyLM

ON = Speculation(tokens=4, max_rows=1 << 20)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    # Grouped attention (two query heads a key/value head), as SmolLM2's: the verifying steps attend it in place
    # (engines/grouped_attention.py).
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny-hf"), heads=4, kv_heads=2)


def test_the_lookup_drafts_what_followed_the_longest_latest_match():
    prompt = [1, 2, 3, 4, 9, 2, 3, 5, 6]
    shared = NgramIndex(2, 3)
    shared.extend(prompt, len(prompt) - 1)
    own = NgramIndex(2, 3, start=len(prompt) - 1)
    # "2 3" occurs twice in the prompt: the later one (followed by 5 6) is drafted.
    assert propose(prompt + [2, 3], own, shared, 4) == [5, 6, 2, 3]
    # The longest ending wins: "1 2 3" (the prompt's start) over the later "2 3".
    assert propose(prompt + [2, 3, 1, 2, 3], NgramIndex(2, 3, start=len(prompt) - 1), shared, 2) == [4, 9]
    assert propose([7, 8], NgramIndex(2, 3), None, 4) == []  # nothing earlier to match


def _run_batch(batch, admissions: dict[int, list], max_steps: int = 400) -> dict:
    """Advance `batch`, admitting admissions[step] before that step (rows joining a running batch); the handles'
    tokens and logprobs as each entry finished."""
    out = {}
    for step in range(max_steps):
        if step in admissions:
            batch.admit(admissions[step])
        if not len(batch) and step > max(admissions):
            break
        if len(batch):
            for entry in batch.advance():
                out[entry["handle"]] = (entry["tokens"], entry["logprobs"])
    return out


def _repetitive_prompts(chat) -> list[list[int]]:
    texts = ["12+7=12+7=12+7=", "3+4=7 3+4=7 3+4=", "9+9=18 9+9=", "1+1=2 1+1=2 1+1=2 1+1="]
    return [chat.prompt([{"role": "user", "content": text}], []) for text in texts]


def _admissions(prompts, temperature: float, budgets=(30, 6, 18, 12)) -> dict[int, list]:
    requests = [(SamplingRequest(prompt, 2, budget, (), temperature, seed=index), index)
                for index, (prompt, budget) in enumerate(zip(prompts, budgets, strict=True))]
    # Two at the start, one joining after 3 steps, one after 9 (the short ones leave meanwhile).
    return {0: requests[:2], 3: requests[2:3], 9: requests[3:]}


def test_greedy_tokens_are_plain_decodings_on_the_torch_engine_with_rows_joining_and_leaving(addition_base_model):
    chat = CharChat()
    prompts = _repetitive_prompts(chat)
    outputs, stats = {}, {}

    def exported(outcome):  # the process's /metrics (workers/telemetry.py)
        return REGISTRY.get_sample_value("studio_speculative_tokens_total", {"outcome": outcome}) or 0.0

    exported_before = exported("drafted"), exported("accepted")
    for name, speculation in (("plain", OFF), ("speculating", ON)):
        engine = TorchEngine(copy.deepcopy(addition_base_model), speculation=speculation)
        batch = engine._open_batch()
        with torch.no_grad():
            outputs[name] = _run_batch(batch, _admissions(prompts, 0.0))
        stats[name] = engine.speculation_stats.as_dict()
        engine.close()
    assert set(outputs["plain"]) == {0, 1, 2, 3}
    for handle, (tokens, logprobs) in outputs["plain"].items():
        assert outputs["speculating"][handle][0] == tokens
        for plain, speculated in zip(logprobs, outputs["speculating"][handle][1], strict=True):
            assert speculated == pytest.approx(plain, abs=1e-4)
    assert stats["plain"]["drafted_tokens"] == 0
    # Drafts were accepted, and some refused (their cache columns rolled back), or the test proves nothing.
    assert 0 < stats["speculating"]["accepted_tokens"] < stats["speculating"]["drafted_tokens"]
    assert (exported("drafted") - exported_before[0], exported("accepted") - exported_before[1]) == (
        stats["speculating"]["drafted_tokens"], stats["speculating"]["accepted_tokens"])


def test_greedy_tokens_are_plain_decodings_on_the_transformers_engine_with_rows_joining_and_leaving(tiny_hf):
    from transformers import AutoTokenizer

    from workers.rl.models.chat_formats import HFChat

    chat = HFChat(AutoTokenizer.from_pretrained(tiny_hf))
    prompts = _repetitive_prompts(chat)
    outputs, stats = {}, {}
    for name, speculation in (("plain", OFF), ("speculating", ON)):
        engine = TransformersEngine(str(tiny_hf), speculation=speculation)
        with torch.no_grad():
            outputs[name] = _run_batch(engine._open_batch(), _admissions(prompts, 0.0, budgets=(40, 6, 25, 14)))
        stats[name] = engine.speculation_stats.as_dict()
        engine.close()
    for handle, (tokens, logprobs) in outputs["plain"].items():
        assert outputs["speculating"][handle][0] == tokens
        for plain, speculated in zip(logprobs, outputs["speculating"][handle][1], strict=True):
            assert speculated == pytest.approx(plain, abs=1e-4)
    assert stats["speculating"]["accepted_tokens"] > 0


def test_a_verifying_step_attends_grouped_heads_in_place_as_transformers_would_by_copying_them(tiny_hf):
    """A step of several tokens a row over a kept cache, with a 4-D additive mask (a verifying step's shape): its
    logits with the grouped heads attended in place (grouped_attention.grouped) are those of transformers' own
    path, which copies the keys and values per query head; and the mask is obeyed (a row that masks part of its
    cache gets other logits)."""
    from transformers import AttentionInterface, DynamicCache

    from workers.rl.engines import grouped_attention

    engine = TransformersEngine(str(tiny_hf), speculation=OFF)  # installs the override
    model = engine.model
    assert AttentionInterface._global_mapping["sdpa"] is grouped_attention._attention
    torch.manual_seed(3)
    prompts, drafts = torch.randint(3, 40, (3, 12)), torch.randint(3, 40, (3, 4))
    minimum = torch.finfo(torch.float32).min
    visible = torch.arange(16)[None, None, None, :] <= (12 + torch.arange(4))[None, None, :, None]
    mask = torch.where(visible, 0.0, minimum).expand(3, 1, 4, 16).clone()
    hidden = mask.clone()
    hidden[1, :, :, :5] = minimum  # row 1 no longer sees its first five columns

    def step(grouped: bool, step_mask):
        with torch.no_grad():
            prefill = model(input_ids=prompts, use_cache=True)
            cache = DynamicCache(ddp_cache_data=[(layer.keys, layer.values) for layer in prefill.cache.layers],
                                 config=model.config)
            with grouped_attention.grouped() if grouped else contextlib.nullcontext():
                return model(input_ids=drafts, position_ids=(12 + torch.arange(4)).expand(3, 4),
                             attention_mask=step_mask, cache=cache, use_cache=True, logits_to_keep=4).logits

    copied, in_place = step(False, mask), step(True, mask)
    assert torch.allclose(in_place, copied, atol=1e-5)
    masked = step(True, hidden)
    assert torch.allclose(masked[0], in_place[0], atol=1e-5) and torch.allclose(masked[2], in_place[2], atol=1e-5)
    assert not torch.allclose(masked[1], in_place[1], atol=1e-3)
    assert torch.allclose(masked, step(False, hidden), atol=1e-5)
    engine.close()


def test_streaming_stops_and_penalties_are_what_plain_decoding_gives(tiny_hf):
    """Through the engine's own loop: tokens streamed one by one in order (accepted drafts too), a stop id or a
    stop check met inside accepted drafts ending the answer there, and a request with penalties (never drafted for)
    beside drafted ones."""
    from transformers import AutoTokenizer

    from workers.rl.models.chat_formats import HFChat

    chat = HFChat(AutoTokenizer.from_pretrained(tiny_hf))
    prompts = _repetitive_prompts(chat)
    plain = TransformersEngine(str(tiny_hf), speculation=OFF)
    reference = plain.generate([GenerationRequest(prompts[0], 1, 40, (), 0.0)])[0][0].token_ids
    plain.close()
    stop_id = reference[20]  # met some way in, possibly inside drafts
    streamed: dict[str, list] = {"plain": [], "speculating": []}
    results = {}
    for name, speculation in (("plain", OFF), ("speculating", ON)):
        engine = TransformersEngine(str(tiny_hf), speculation=speculation)
        requests = [
            GenerationRequest(prompts[0], 1, 40, (stop_id,), 0.0,
                              on_token=lambda sample, token, name=name: streamed[name].append(token)),
            GenerationRequest(prompts[0], 1, 40, (), 0.0, stop_check=lambda tokens: len(tokens) >= 13),
            GenerationRequest(prompts[1], 2, 20, (), 0.0, presence_penalty=0.5, frequency_penalty=0.3),
            GenerationRequest(prompts[3], 2, 20, (), 0.0),
        ]
        results[name] = [[(c.token_ids, c.finish_reason) for c in group] for group in engine.generate(requests)]
        if name == "speculating":
            assert engine.speculation_stats.accepted > 0
        engine.close()
    assert results["speculating"] == results["plain"]
    assert results["plain"][0][0] == (reference[:reference.index(stop_id) + 1], "stop")
    assert len(results["plain"][1][0][0]) == 13
    assert streamed["speculating"] == streamed["plain"] == results["plain"][0][0][0]


def _exact_distribution(model, prompt: list[int], vocab: int, length: int) -> dict[tuple, float]:
    """Every continuation of `length` tokens with its probability under `model` (temperature 1)."""
    sequences = list(itertools.product(range(vocab), repeat=length))
    ids = torch.tensor([prompt + list(s) for s in sequences])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids)[0][:, len(prompt) - 1:-1], dim=-1)
    chosen = logprobs.gather(2, ids[:, len(prompt):, None]).squeeze(2).sum(dim=1).exp()
    return dict(zip(sequences, chosen.tolist(), strict=True))


def test_sampled_outputs_keep_the_models_distribution():
    """A small random TinyLM over 3 tokens and a prompt repeating one pattern, so that most steps draft: 6,000
    samples of 4 tokens, each from its own seed, against the exact probabilities of the 81 continuations. A
    sampler keeping drafts without checking them writes the prompt's pattern far too often (chi-square p ~ 0);
    one checking them as speculation.py does is indistinguishable from the model (p above 0.001, with these seeds
    fixed). The logprobs recorded are the model's."""
    torch.manual_seed(3)
    model = TinyLM(ModelConfig(vocab_size=3, block_size=32, n_layer=1, n_head=2, n_embd=16)).eval()
    with torch.no_grad():
        model.head.weight.mul_(8.0)  # peakier than a fresh model's near-uniform distributions
    prompt, length, samples = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0], 4, 6000
    engine = TorchEngine(model, speculation=ON, max_batch_rows=samples)
    requests = [GenerationRequest(prompt, 1, length, (), 1.0, seed=seed) for seed in range(samples)]
    completions = [group[0] for group in engine.generate(requests)]
    stats = engine.speculation_stats.as_dict()
    engine.close()
    assert 0.1 < stats["acceptance_rate"] < 0.9 and stats["drafted_tokens"] > samples
    exact = _exact_distribution(model, prompt, 3, length)
    counts = dict.fromkeys(exact, 0)
    for completion in completions:
        counts[tuple(completion.token_ids)] += 1
    keys = sorted(exact)
    observed = [counts[key] for key in keys]
    expected = [exact[key] * samples for key in keys]
    # Pool the continuations expected fewer than 5 times (chi-square's rule of thumb) into one category.
    rare = [i for i, e in enumerate(expected) if e < 5]
    common = [i for i, e in enumerate(expected) if e >= 5]
    observed_pooled = [observed[i] for i in common] + [sum(observed[i] for i in rare)]
    expected_pooled = [expected[i] for i in common] + [sum(expected[i] for i in rare)]
    expected_pooled[-1] += samples - sum(expected_pooled)  # rounding of the exact probabilities
    assert chisquare(observed_pooled, expected_pooled).pvalue > 0.001
    for completion in completions[:50]:
        recomputed = [
            torch.log_softmax(model(torch.tensor([prompt + completion.token_ids[:i]]))[0][0, -1], dim=-1)[token].item()
            for i, token in enumerate(completion.token_ids)]
        assert completion.logprobs == pytest.approx(recomputed, abs=1e-4)
