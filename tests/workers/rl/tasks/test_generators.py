"""Generated task sets (workers/rl/tasks/generators.py): the same instances from the same generator spec in every
process, whatever its string hash; a spec naming another release of the library than the one installed is refused;
the version's content hash covers the library's release, the seed and the size."""

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest

from workers.definitions import content_hash, validate_spec
from workers.definitions.specs import SpecError
from workers.rl.tasks.generators import GeneratorError, materialise, materialise_many

VERSION = metadata.version("reasoning-gym")
# Datasets whose entries change with the process's string hash (they iterate over sets of strings) or draw from
# Python's global random generator (list_functions), beside one that does neither (chain_sum).
SENSITIVE = ["isomorphic_strings", "ransom_note", "word_ladder", "polynomial_multiplication", "list_functions",
             "chain_sum"]
TEMPLATE = {"prompt_template": "{question}", "sandbox_image": "reasoning-gym", "verifier": "reasoning-gym-score"}


def generator(dataset: str, *, size: int = 6, seed: int = 3, version: str = VERSION, **config) -> dict:
    return {"library": "reasoning-gym", "version": version, "dataset": dataset, "config": config, "seed": seed,
            "size": size}


MATERIALISE = """
import hashlib, json, sys
from workers.definitions.canonical import canonical_bytes
from workers.rl.tasks.generators import materialise_many
made = materialise_many(json.loads(sys.argv[1]))
print(json.dumps([hashlib.sha256(canonical_bytes(instances)).hexdigest() for instances in made]))
"""


def test_two_processes_with_different_string_hashes_make_the_same_instances():
    generators = json.dumps([generator(name) for name in SENSITIVE])
    processes = [subprocess.Popen([sys.executable, "-c", MATERIALISE, generators], stdout=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONHASHSEED": hash_seed})
                 for hash_seed in ("1", "2")]
    digests = [json.loads(process.communicate(timeout=120)[0]) for process in processes]
    assert all(process.returncode == 0 for process in processes)
    assert digests[0] == digests[1] and len(set(digests[0])) == len(SENSITIVE)


def test_instances_are_keyed_by_dataset_seed_and_index_and_hide_what_scores_them():
    small, large, other_seed = materialise_many([generator("chain_sum", size=3), generator("chain_sum", size=6),
                                                 generator("chain_sum", size=3, seed=4)])
    assert [item["key"] for item in small] == ["chain_sum-3-0", "chain_sum-3-1", "chain_sum-3-2"]
    assert large[:3] == small  # a larger set starts with the smaller one: index i is the same task
    assert [item["inputs"] for item in other_seed] != [item["inputs"] for item in small]
    first = small[0]
    assert first["inputs"] == {"question": first["hidden"]["entry"]["question"]}
    assert {k: v for k, v in first["hidden"].items() if k != "entry"} == {
        "library": "reasoning-gym", "version": VERSION, "dataset": "chain_sum", "config": {}}
    assert first["hidden"]["entry"]["metadata"]["source_dataset"] == "chain_sum"
    json.dumps(first["hidden"], allow_nan=False)  # JSON as it is stored


def test_another_release_of_the_library_than_the_one_installed_is_refused_naming_both():
    with pytest.raises(GeneratorError) as refused:
        materialise(generator("chain_sum", version="0.1.24"))
    assert f"reasoning-gym 0.1.24 made these instances, but this host has reasoning-gym {VERSION}" in str(refused.value)


def test_what_the_library_refuses_is_said_per_dataset():
    made = materialise_many([generator("no_such_dataset"), generator("chain_sum", size=2),
                             generator("chain_sum", size=2, no_such_option=1)])
    assert isinstance(made[0], GeneratorError) and "no_such_dataset" in str(made[0])
    assert len(made[1]) == 2
    assert isinstance(made[2], GeneratorError) and "no_such_option" in str(made[2])


def test_the_content_hash_covers_the_librarys_release_seed_size_and_config_and_leaves_older_templates_alone():
    hashes = {content_hash(validate_spec("task_template", {**TEMPLATE, "generator": g})) for g in [
        generator("chain_sum"), generator("chain_sum", version="0.1.26"), generator("chain_sum", seed=4),
        generator("chain_sum", size=7), generator("chain_sum", min_terms=3)]}
    assert len(hashes) == 5
    plain = validate_spec("task_template", TEMPLATE)
    assert "generator" not in plain  # a template published before generators keeps its content hash
    with pytest.raises(SpecError) as refused:
        validate_spec("task_template", {**TEMPLATE, "generator": {**generator("chain_sum"), "config": {"seed": 1}}})
    assert "generator.config" in str(refused.value) and "seed" in str(refused.value)
    with pytest.raises(SpecError, match="generator.library"):
        validate_spec("task_template", {**TEMPLATE, "generator": {**generator("chain_sum"), "library": "gym"}})


def test_a_generated_tasks_reference_is_its_entrys_answer_where_the_scorer_looks_for_it():
    from workers.rl.models.base_model import reference_turns

    (item,) = materialise(generator("chain_sum", size=1))
    answer = item["hidden"]["entry"]["answer"]
    assert reference_turns(tools=[], inputs=item["inputs"], hidden=item["hidden"], rng=None) == [
        {"role": "assistant", "content": f"<answer>{answer}</answer>"}]
    unanswered = {**item["hidden"], "entry": {**item["hidden"]["entry"], "answer": None}}
    assert reference_turns(tools=[], inputs=item["inputs"], hidden=unanswered, rng=None) is None
