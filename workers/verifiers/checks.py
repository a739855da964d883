"""The check types a Verifier spec can hold, in one place: each one's spec class (workers/definitions/specs.py)
and the function that runs it, `check(spec, sample, item, context) -> Outcome` (types.py), whose `spec` is the
validated object of that class, its fields attributes with their defaults filled in. A new check type is its
spec class (in specs.py's CheckSpec union and CHECKS_BY_LAYER), its function and its line in IMPLEMENTATIONS;
tests/workers/verifiers/test_checks.py fails while one of them is missing.

Functions are named, not imported: a module is imported on first use, so a worker that never judges never
imports the judge's client (nor the 3D stack).
"""

import importlib
import typing
from functools import cache

from workers.definitions.specs import (
    Check,
    Citations,
    GeneratorScore,
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
    GeneratorScore: "generated.generator_score_check",
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
