"""The one registry of check types (workers/verifiers/checks.py): every check a Verifier spec can hold has the
function that runs it, every function its spec class, and each function reads its spec as that class's object
(defaults and all), so a new check type is its spec class, its function and one line there."""

import subprocess
import sys
import typing

from workers.definitions.specs import CHECKS_BY_LAYER, Check, CheckSpec, NumericMatch, parse_spec
from workers.verifiers import Item, Sample, verify
from workers.verifiers.checks import IMPLEMENTATIONS, SPEC_CLASSES, check_function, check_type


def _subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct, *_subclasses(direct)}}


def test_every_check_type_of_the_spec_has_its_function_and_every_function_its_spec_class():
    union, _ = typing.get_args(CheckSpec)  # Annotated[Union[...], Field(discriminator="type")]
    in_the_spec = set(typing.get_args(union))
    assert set(IMPLEMENTATIONS) == in_the_spec == _subclasses(Check)
    assert set(SPEC_CLASSES) == set().union(*CHECKS_BY_LAYER.values())
    assert all(SPEC_CLASSES[check_type(spec_class)] is spec_class for spec_class in IMPLEMENTATIONS)


def test_each_check_function_takes_its_own_spec_class():
    for spec_class in IMPLEMENTATIONS:
        function = check_function(check_type(spec_class))
        assert typing.get_type_hints(function)["spec"] is spec_class, function.__qualname__


def test_a_check_reads_the_defaults_of_its_spec_class():
    # rel_tolerance and parse_scale left out: NumericMatch's defaults (1e-9, scale words read) apply.
    spec = parse_spec("verifier", {"layers": [{"name": "number", "kind": "exact", "checks": [{"type": "numeric"}]}]})
    verdict = verify(spec, Sample("Answer: 1.2 million"), Item("k", {}, {"answer": "1200000"}), None)
    assert verdict.status == "pass" and verdict.components[0].name == "numeric-0"
    assert spec.layers[0].checks[0] == NumericMatch(type="numeric")


def test_a_worker_that_never_judges_never_imports_the_judge_nor_the_3d_stack():
    program = ("import sys\nfrom workers.definitions.specs import parse_spec\n"
               "from workers.verifiers import Item, Sample, verify\n"
               "spec = parse_spec('verifier', {'layers': [{'name': 'n', 'kind': 'exact', "
               "'checks': [{'type': 'numeric'}]}]})\n"
               "assert verify(spec, Sample('Answer: 3'), Item('k', {}, {'answer': 3}), None).status == 'pass'\n"
               "print(sorted(m for m in ('openai', 'trimesh', 'matplotlib', 'workers.verifiers.judge', "
               "'workers.verifiers.mesh') if m in sys.modules))\n")
    imported = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "[]"
