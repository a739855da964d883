"""The demo's base model, made here: a character vocabulary, a synthetic corpus of the demo's arithmetic
format, and a pretraining loop of about a minute on the CPU.

Half the corpus's answers are wrong on purpose, so the base model learns the format ("12+7=" is followed by
digits and a newline) without learning to be right: the gap RL is there to close.
"""

import random
import time
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from .model import ModelConfig, TinyLM

ALPHABET = "\n0123456789+="
END = "\n"


@dataclass(frozen=True)
class CharTokenizer:
    alphabet: str = ALPHABET

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet)

    @property
    def end(self) -> int:
        return self.alphabet.index(END)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - set(self.alphabet))
        if unknown:
            raise ValueError(f"characters outside the vocabulary: {unknown}")
        return [self.alphabet.index(c) for c in text]

    def decode(self, tokens) -> str:
        return "".join(self.alphabet[int(t)] for t in tokens)


def addition_line(rng: random.Random, *, wrong_fraction: float, limit: int = 30) -> str:
    a, b = rng.randrange(limit), rng.randrange(limit)
    answer = a + b
    if rng.random() < wrong_fraction:
        answer = max(0, answer + rng.choice([-3, -2, -1, 1, 2, 3, 10, -10]))
    return f"{a}+{b}={answer}\n"


def pretrain(*, seconds: float = 60.0, steps: int | None = None, seed: int = 0, wrong_fraction: float = 0.5,
             batch_size: int = 64, lr: float = 3e-3, progress=None) -> tuple[TinyLM, CharTokenizer, dict]:
    """Train a TinyLM on noisy addition lines until `seconds` pass (or `steps` are done)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = CharTokenizer()
    model = TinyLM(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=48))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    started, step, losses = time.monotonic(), 0, []
    while (steps is None and time.monotonic() - started < seconds) or (steps is not None and step < steps):
        text = "".join(addition_line(rng, wrong_fraction=wrong_fraction) for _ in range(batch_size * 6))
        data = torch.tensor(tokenizer.encode(text))
        starts = torch.randint(0, len(data) - model.config.block_size - 1, (batch_size,))
        x = torch.stack([data[s:s + model.config.block_size] for s in starts])
        y = torch.stack([data[s + 1:s + model.config.block_size + 1] for s in starts])
        logits, _ = model(x)
        loss = F.cross_entropy(logits.reshape(-1, tokenizer.vocab_size), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        step += 1
        if progress and step % 50 == 0:
            progress(step, losses[-1])
    return model.eval(), tokenizer, {"steps": step, "seconds": round(time.monotonic() - started, 1),
                                     "first_loss": losses[0], "last_loss": sum(losses[-20:]) / len(losses[-20:])}


def addition_accuracy(model: TinyLM, tokenizer: CharTokenizer, *, problems: int = 100, seed: int = 1) -> dict:
    """Greedy-ish check of what the model knows: the share of well-formed answers and of right ones."""
    rng = random.Random(seed)
    formed = right = 0
    generator = torch.Generator().manual_seed(seed)
    for _ in range(problems):
        a, b = rng.randrange(30), rng.randrange(30)
        tokens, _ = model.generate(tokenizer.encode(f"{a}+{b}="), samples=1, max_new_tokens=4, stop=tokenizer.end,
                                   temperature=0.1, generator=generator)
        text = tokenizer.decode(tokens[0])
        answer = text.split(END)[0]
        formed += answer.isdigit() and END in text
        right += answer == str(a + b)
    return {"well_formed": formed / problems, "accuracy": right / problems}
