"""Which function runs each check type of a Verifier spec. Modules are imported on first use, so a worker
that never judges never imports the judge's client (nor the 3D stack)."""

import importlib
from functools import cache

# check type -> module under workers.verifiers that exports it in its CHECKS dict
MODULES = {
    "string_check": "text", "text_similarity": "text", "regex": "text", "json_schema": "text",
    "numeric": "numbers", "math": "mathcheck", "citations": "documents",
    "unit_tests": "unit_tests", "python_grader": "graders", "log_rules": "logs",
    "mesh_geometry": "mesh", "score_model": "judge", "label_model": "judge",
}


@cache
def check_function(check_type: str):
    if check_type not in MODULES:
        raise KeyError(f"no check implements {check_type!r}; known: {', '.join(sorted(MODULES))}")
    module = importlib.import_module(f"{__package__}.{MODULES[check_type]}")
    return module.CHECKS[check_type]
