"""The check types a Verifier spec can hold, in one place: each one's spec class (workers/definitions/specs.py)
and the function that runs it, `check(spec, sample, item, context) -> Outcome` (types.py), whose `spec` is the
validated object of that class, its fields attributes with their defaults filled in. A new check type is its
spec class (in specs.py's CheckSpec union and CHECKS_BY_LAYER), its function and its line in IMPLEMENTATIONS;
tests/workers/verifiers/test_checks.py fails while one of them is missing.

Functions are named, not imported: a module is imported on first use, so a worker that never judges never
imports the judge's client (nor the 3D stack).
"""

import copy
import importlib
import typing
from functools import cache

from workers.definitions.specs import (
    Check,
    Citations,
    JsonSchemaCheck,
    LabelModel,
    LogRules,
    MathMatch,
    MeshGeometry,
    NumericMatch,
    PythonGrader,
    RegexMatch,
    RepositoryTests,
    ScoreModel,
    StringCheck,
    TextSimilarity,
    UnitTests,
    VerifierSpec,
    parse_spec,
)

# spec class -> "module.function" under workers.verifiers
IMPLEMENTATIONS: dict[type[Check], str] = {
    StringCheck: "text.string_check",
    TextSimilarity: "text.text_similarity_check",
    RegexMatch: "text.regex_check",
    JsonSchemaCheck: "text.json_schema_check",
    NumericMatch: "numbers.numeric_check",
    MathMatch: "mathcheck.math_check",
    Citations: "documents.citations_check",
    UnitTests: "unit_tests.unit_tests_check",
    RepositoryTests: "repository.repository_tests_check",
    PythonGrader: "graders.python_grader_check",
    LogRules: "logs.log_rules_check",
    MeshGeometry: "mesh.mesh_geometry_check",
    ScoreModel: "judge.score_model_check",
    LabelModel: "judge.label_model_check",
}


def check_type(spec_class: type[Check]) -> str:
    """The `type` a spec names its check by: the one value of the class's `type` literal."""
    (name,) = typing.get_args(spec_class.model_fields["type"].annotation)
    return name


SPEC_CLASSES: dict[str, type[Check]] = {check_type(spec_class): spec_class for spec_class in IMPLEMENTATIONS}


@cache
def check_function(name: str):
    if name not in SPEC_CLASSES:
        raise KeyError(f"no check implements {name!r}; known: {', '.join(sorted(SPEC_CLASSES))}")
    module, function = IMPLEMENTATIONS[SPEC_CLASSES[name]].rsplit(".", 1)
    return getattr(importlib.import_module(f"{__package__}.{module}"), function)


# id of a caller's spec dict -> (that dict, a copy of it as parsed, the parsed spec). The dict itself is held so
# that its id cannot be reused while the entry lives; the copy tells a dict changed in place since.
_parsed: dict[int, tuple[dict, dict, VerifierSpec]] = {}
MAX_PARSED = 256


def verifier_spec(spec: VerifierSpec | dict) -> VerifierSpec:
    """A Verifier spec as its typed object; SpecError names what is wrong with an invalid one.

    Parsed once per spec: a task template hands the same dict to the verifier for every sample, and parsing it
    (~50 us) would be a fifth of a numeric verdict. A dict changed in place is parsed again."""
    if isinstance(spec, VerifierSpec):
        return spec
    hit = _parsed.get(id(spec))
    if hit is not None and hit[0] is spec and hit[1] == spec:
        return hit[2]
    parsed = parse_spec("verifier", spec)
    if len(_parsed) >= MAX_PARSED:
        _parsed.clear()
    _parsed[id(spec)] = (spec, copy.deepcopy(spec), parsed)
    return parsed
