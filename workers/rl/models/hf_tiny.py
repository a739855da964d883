"""A tiny Hugging Face causal LM made here and saved to a local directory: a stand-in for a real checkpoint.

It is a genuine `LlamaForCausalLM` with a character-level `PreTrainedTokenizerFast` and a ChatML chat
template, so everything that loads "any Hugging Face model by local path" — HFPolicy, the transformers and
vLLM engines, TRL's GRPOTrainer in `bench trainer` — loads it exactly as it would load Qwen or Llama. Random
weights by default; `pretrain_hf_addition` teaches it the noisy a+b corpus for the trainer benchmark.
"""

from __future__ import annotations

import random
from pathlib import Path

from .chat_formats import CHAR_VOCABULARY

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer():
    """One token per printable character, plus the ChatML markers as special tokens."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocabulary = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    for char in CHAR_VOCABULARY:
        vocabulary.setdefault(char, len(vocabulary))
    backend = Tokenizer(models.BPE(vocab=vocabulary, merges=[], unk_token="?"))  # no merges: characters
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        unk_token="?", additional_special_tokens=SPECIAL_TOKENS[1:])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_tiny_hf_model(directory: Path, *, hidden_size: int = 64, layers: int = 2, heads: int = 4,
                       kv_heads: int | None = None, max_positions: int = 256, seed: int = 0) -> Path:
    """Save a randomly initialised tiny Llama and its tokenizer under `directory`; returns the directory.
    `kv_heads`: fewer key/value heads than `heads` makes its attention grouped, as SmolLM2's is."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = char_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                         max_position_embeddings=max_positions, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def addition_prompt(a: int, b: int) -> list[dict]:
    return [{"role": "user", "content": f"{a}+{b}="}]


def pretrain_hf_addition(directory: Path, *, steps: int, limit: int = 30, wrong_fraction: float = 0.5,
                         seed: int = 0, lr: float = 3e-3, batch: int = 64) -> dict:
    """Teach the model at `directory` the chat format of a+b (a, b < limit) from a corpus whose answers are
    wrong `wrong_fraction` of the time, in place: it learns the format and is right about half the time."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        rows = []
        for _ in range(batch):
            a, b = rng.randrange(limit), rng.randrange(limit)
            answer = a + b if rng.random() >= wrong_fraction else max(0, a + b + rng.choice([-2, -1, 1, 2, 10]))
            text = tokenizer.apply_chat_template(addition_prompt(a, b) + [{"role": "assistant",
                                                                           "content": str(answer)}], tokenize=False)
            rows.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        width = max(len(r) for r in rows)
        ids = torch.full((batch, width), tokenizer.pad_token_id)
        for index, row in enumerate(rows):
            ids[index, :len(row)] = torch.tensor(row)
        labels = ids.masked_fill(ids == tokenizer.pad_token_id, -100)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.save_pretrained(directory)
    return {"steps": steps, "first_loss": losses[0], "last_loss": sum(losses[-10:]) / len(losses[-10:])}
