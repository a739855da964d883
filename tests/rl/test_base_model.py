"""The base model the project makes itself learns the demo's format from its noisy corpus."""

import pytest

from workers.rl.base_model import CharTokenizer, addition_accuracy, addition_line, pretrain


def test_the_tokenizer_round_trips_and_refuses_what_it_cannot_encode():
    tokenizer = CharTokenizer()
    assert tokenizer.decode(tokenizer.encode("12+7=19\n")) == "12+7=19\n"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.encode("12 + x")


def test_the_corpus_is_noisy_on_purpose():
    import random

    rng = random.Random(0)
    lines = [addition_line(rng, wrong_fraction=0.5) for _ in range(2000)]
    wrong = sum(int(a) + int(b) != int(c) for a, b, c in
                (line.strip().replace("+", " ").replace("=", " ").split() for line in lines))
    assert 0.4 < wrong / len(lines) < 0.6


def test_a_short_pretraining_learns_the_format():
    model, tokenizer, report = pretrain(steps=120, seed=0)
    assert report["last_loss"] < report["first_loss"] * 0.6
    scores = addition_accuracy(model, tokenizer, problems=40)
    assert scores["well_formed"] >= 0.9, scores
