"""The demo's base model, made here: a character-level TinyLM pretrained in about a minute on the CPU on
noisy renderings of the demo's own tasks.

Each task instance becomes a conversation in the CharChat format: the prompt, then an answer built from the
instance's hidden reference (the number, the canonical solution, the reference script, the cited sentence),
sometimes preceded by a tool call and its result. Half of the answers are corrupted on purpose — one number
in them is off — so the model learns the formats and has seen the answers without learning which are
right: it is unreliable in the way RL on verifiable rewards fixes. (Short tasks such as `12+7=` get most of
the pretraining; the long formats of code, JSON and scripts get enough to be written, rarely correctly.)
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from .chat import CharChat
from .model import ModelConfig, TinyLM

NUMBER = re.compile(r"(?<![A-Za-z_])\d+")
SHORT_EXAMPLE_CHARS = 48  # an example this short trains in the cheap short-context batches


@dataclass(frozen=True)
class Example:
    """One pretraining conversation: messages in the chat format's roles."""

    messages: tuple[dict, ...]


def _code_block(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def reference_turns(*, tools: list[dict], inputs: dict, hidden: dict, rng: random.Random,
                    tool_call_fraction: float = 0.3) -> list[dict] | None:
    """The assistant's side of a right answer, from the hidden fields the demo's task families use:
    `canonical_solution` / `reference_script` (code), `citations` with `answer` (document QA), `working`
    with `answer` (word problems), or a bare `answer`. None when the instance has none of them."""
    tool_names = {tool["name"] for tool in tools}
    code = hidden.get("canonical_solution") or hidden.get("reference_script")
    if code:
        answer = _code_block(code)
        if "run_python" in tool_names and rng.random() < tool_call_fraction:
            call, _, expected = (inputs.get("example") or "").partition(" == ")
            probe = f"{code.rstrip()}\nprint({call})" if call else code
            output = f"exit code 0\nstdout:\n{expected}\n" if call else "exit code 0\nstdout:\n"
            return [{"role": "assistant", "content": "<tool_call>" + json.dumps(
                        {"name": "run_python", "arguments": {"code": probe}}) + "</tool_call>"},
                    {"role": "tool", "content": output}, {"role": "assistant", "content": answer}]
        return [{"role": "assistant", "content": answer}]
    if hidden.get("citations") and "answer" in hidden:
        citation = hidden["citations"][0]
        answer = json.dumps({"answer": str(hidden["answer"]),
                             "citations": [{"doc_id": c["doc_id"], "quote": c["span"]} for c in hidden["citations"]]})
        if "search_documents" in tool_names and rng.random() < tool_call_fraction:
            query = " ".join(citation["span"].split()[:3])
            return [{"role": "assistant", "content": "<tool_call>" + json.dumps(
                        {"name": "search_documents", "arguments": {"query": query}}) + "</tool_call>"},
                    {"role": "tool", "content": f"{citation['doc_id']}: {citation['span']}"},
                    {"role": "assistant", "content": answer}]
        return [{"role": "assistant", "content": answer}]
    if "working" in hidden and "answer" in hidden:
        return [{"role": "assistant", "content": f"{hidden['working']}\nAnswer: {hidden['answer']}"}]
    if "answer" in hidden:
        return [{"role": "assistant", "content": str(hidden["answer"])}]
    return None


def corrupt(text: str, rng: random.Random) -> str:
    """The same answer with one of its numbers off by a little (or by ten)."""
    numbers = list(NUMBER.finditer(text))
    if not numbers:
        return text
    match = rng.choice(numbers)
    value = max(0, int(match.group()) + rng.choice([-3, -2, -1, 1, 2, 3, 10, -10]))
    return text[:match.start()] + str(value) + text[match.end():]


def pretraining_example(*, prompt: str, turns: list[dict], rng: random.Random, wrong_fraction: float) -> str:
    """One rendered conversation; with probability wrong_fraction its final answer is corrupted."""
    turns = [dict(t) for t in turns]
    if rng.random() < wrong_fraction:
        turns[-1]["content"] = corrupt(turns[-1]["content"], rng)
    return CharChat().render([{"role": "user", "content": prompt}, *turns])


def pretrain(conversations, *, seconds: float = 60.0, steps: int | None = None, seed: int = 0,
             wrong_fraction: float = 0.5, block_size: int = 512, short_fraction: float = 0.6,
             lr: float = 3e-3, progress=None) -> tuple[TinyLM, dict]:
    """Pretrain a TinyLM on `conversations`, a list of (prompt, reference turns), for `seconds` (or `steps`).

    Each batch packs freshly noised conversations into windows: short ones into 64-character windows (most
    steps: cheap, and the arithmetic the demo's RL story lifts), the rest into `block_size` windows."""
    if not conversations:
        raise ValueError("no conversations to pretrain on")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    chat = CharChat()
    model = TinyLM(ModelConfig(vocab_size=chat.tokenizer.vocab_size, block_size=block_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    short, long = [], []
    for conversation in conversations:
        prompt, turns = conversation
        (short if len(prompt) + sum(len(t["content"]) for t in turns) <= SHORT_EXAMPLE_CHARS else long).append(
            conversation)
    started, step, losses = time.monotonic(), 0, []

    def window(pool, width, batch):
        rows = []
        for _ in range(batch):
            text = ""
            while len(text) < 2 * width + 1:
                prompt, turns = rng.choice(pool)
                text += pretraining_example(prompt=prompt, turns=turns, rng=rng, wrong_fraction=wrong_fraction)
            offset = rng.randrange(0, len(text) - width - 1)
            rows.append(chat.tokenizer.encode(text[offset:offset + width + 1]))
        return torch.tensor(rows)

    while (steps is None and time.monotonic() - started < seconds) or (steps is not None and step < steps):
        use_short = short and (not long or rng.random() < short_fraction)
        data = window(short, 64, 64) if use_short else window(long, block_size, 16)
        logits, _ = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, chat.tokenizer.vocab_size), data[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        step += 1
        if progress and step % 25 == 0:
            progress(step, losses[-1], time.monotonic() - started)
    return model.eval(), {"steps": step, "seconds": round(time.monotonic() - started, 1),
                          "first_loss": losses[0], "last_loss": sum(losses[-20:]) / len(losses[-20:]),
                          "conversations": len(conversations), "short": len(short), "long": len(long)}
