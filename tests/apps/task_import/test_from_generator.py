"""`manage.py tasks from-generator reasoning-gym`: every dataset's reference check through the real generator_score
scorer in the sandbox (its own answers score 1, an empty answer 0; one execution per dataset), and the command end to
end: a shared image and verifier, a template and a category-tagged domain per dataset, a bundle, the refused ones
with their reason, and a second run that publishes nothing new."""

from io import StringIO

import pytest
from django.core.management import call_command

from apps.registry.errors import SpecError
from apps.registry.models import Definition, Version
from apps.registry.services import version_publish
from apps.task_import.generated import NOT_GENERATORS, reference_problem
from tests.support.generated import IMAGE, VERSION, generated_pool
from workers.rl.tasks.generators import library_datasets, materialise_many

pytestmark = pytest.mark.sandbox

# reasoning-gym 0.1.25's datasets that its own reference check refuses (seed 0, the first three entries), by why:
# - no answer: the entry carries none (its scorer checks an answer against the puzzle itself);
# - empty: an empty answer scores above 0 (a format bonus of 0.01 or 0.05 for any text);
# - own answer: the entry's own answer does not score 1 once the entry is JSON (ARC's boards are tuples of tuples);
# - code: the scorer compiles text while it scores (eval, sympy's parse_expr), which generator_score refuses
#   (workers/verifiers/generated.py): an answer run as code could read the reference.
REFUSED = {
    **dict.fromkeys(["boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"], "carry no answer"),
    **dict.fromkeys(["advanced_geometry", "color_cube_rotation", "emoji_mystery",
                     "fraction_simplification", "power_function", "prime_factorization",
                     "sentence_reordering"], "an empty answer scored"),
    **dict.fromkeys(["bitwise_arithmetic", "countdown", "intermediate_integration", "number_sorting",
                     "polynomial_multiplication", "puzzle24", "simple_integration"],
                    "the scorer runs the answer as Python code"),
    **dict.fromkeys(["arc_agi", "rearc"], "its own answer scored 0.05"),
}


def test_every_reasoning_gym_dataset_passes_or_is_refused_by_its_reference_check_for_the_reason_expected():
    names = [d.name for d in library_datasets("reasoning-gym") if d.name not in NOT_GENERATORS]
    made = materialise_many([{"library": "reasoning-gym", "version": VERSION, "dataset": name, "config": {},
                              "seed": 0, "size": 3} for name in names])
    with generated_pool() as pool:
        problems = {name: reference_problem(pool, IMAGE, instances)
                    for name, instances in zip(names, made, strict=True)}
    refused = {name: problem for name, problem in problems.items() if problem}
    assert set(refused) == set(REFUSED), refused
    assert all(REFUSED[name] in problem for name, problem in refused.items()), refused
    assert len(names) - len(refused) >= 80


def test_from_generator_publishes_a_domain_per_dataset_and_refuses_the_ones_its_check_refuses(project, owner):
    out = StringIO()
    arguments = ["tasks", "from-generator", "reasoning-gym", "--datasets", "chain_sum,ransom_note,countdown,composite",
                 "--size", "4", "--seed", "2", "--project", project.slug]
    call_command(*arguments, stdout=out)
    printed = out.getvalue()
    assert "2 domain(s) in bundle/reasoning-gym@1 (2 published, 0 unchanged), 2 refused" in printed
    assert "refused countdown (games): countdown-2-0: its own answer scored 0 (answer " in printed
    assert "the scorer runs the answer as Python code" in printed
    assert "refused composite (composite): mixes other datasets" in printed

    def newest(kind, slug):
        return Version.objects.filter(definition__project=project, definition__kind=kind,
                                      definition__slug=slug).latest("number")

    template = newest("task_template", "rg-chain-sum")
    assert template.spec["generator"] == {"library": "reasoning-gym", "version": VERSION, "dataset": "chain_sum",
                                          "config": {}, "seed": 2, "size": 4}
    assert template.spec["sandbox_image"] == "reasoning-gym@1" and template.spec["verifier"] == "reasoning-gym-score@1"
    assert sorted(template.instance_set.members.values_list("key", flat=True)) == [f"chain_sum-2-{i}" for i in range(4)]
    assert newest("domain", "rg-chain-sum").spec["category"] == "arithmetic"
    assert newest("domain", "rg-ransom-note").spec["category"] == "algorithmic"
    bundle = newest("bundle", "reasoning-gym")
    assert bundle.spec["members"] == ["domain/rg-chain-sum@1", "domain/rg-ransom-note@1"]
    assert newest("sandbox_image", "reasoning-gym").spec["layers"][1]["packages"][0] == f"reasoning-gym=={VERSION}"
    assert not Definition.objects.filter(project=project, slug="rg-countdown").exists()

    # Run again on what it published: the same versions, without making or checking their tasks again.
    versions = Version.objects.count()
    again = StringIO()
    call_command(*arguments[:4], "chain_sum,ransom_note", *arguments[5:], stdout=again)
    assert Version.objects.count() == versions
    assert "(0 published, 2 unchanged), 0 refused" in again.getvalue() and "making" not in again.getvalue()

    # The same template made with another release: refused at publish, naming both releases.
    older = {**template.spec, "generator": {**template.spec["generator"], "version": "0.1.24"}}
    with pytest.raises(SpecError) as refused:
        version_publish(project=project, kind="task_template", slug="rg-chain-sum", spec=older, author=owner)
    assert refused.value.errors[0].field == "generator"
    assert f"reasoning-gym 0.1.24 made these instances, but this host has reasoning-gym {VERSION}" in str(refused.value)
