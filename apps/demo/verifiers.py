"""Verifiers of the demo, layered cheapest first: exact checks, then environment feedback, then a judge model.

A layer with an escalate band hands scores inside [uncertain_low, uncertain_high) to the next layer and decides
the rest itself; a layer without one decides on its own score, unless it says continue_on_pass: then a pass
goes on to the next layer for scrutiny and only a failure decides (workers/verifiers/pipeline.py).
"""

from .draft import Draft

NUMERIC_EXACT = {
    "pass_threshold": 1.0,
    "layers": [
        # A plain number either matches or it does not; a miss may only be a form the parser does not read
        # ("14/2", "\\boxed{7}"), so it escalates to symbolic equivalence rather than scoring 0 outright.
        {"name": "number", "kind": "exact",
         "checks": [{"type": "numeric", "name": "answer-value", "reference": "{answer}", "abs_tolerance": 0,
                     "rel_tolerance": 0, "parse_scale": False}],
         "escalate": {"uncertain_low": 0.0, "uncertain_high": 0.5}},
        {"name": "math", "kind": "exact",
         "checks": [{"type": "math", "name": "math-equivalence", "reference": "{answer}", "timeout_seconds": 5}]},
    ],
}

# For questions that are themselves an expression ("What is 19+14?"): the number read, nothing evaluated. Under
# numeric-exact, whose math layer evaluates what it finds, restating the question scores: SmolLM2-135M learned
# to answer "To solve 19+14, we" (cut at its token limit) within 12 steps, 58 of 80 sums "right" that way.
NUMBER_ONLY = {
    "pass_threshold": 1.0,
    "layers": [
        {"name": "number", "kind": "exact",
         "checks": [{"type": "numeric", "name": "answer-value", "reference": "{answer}", "abs_tolerance": 0,
                     "rel_tolerance": 0, "parse_scale": False}]},
    ],
}

PYTHON_UNIT_TESTS = {
    "pass_threshold": 1.0,
    "layers": [
        {"name": "unit-tests", "kind": "exact",
         # All or nothing: with a share of the tests, a stub returning None would earn the half that checks
         # the arguments are left unchanged, and a policy learns stubs.
         "checks": [{"type": "unit_tests", "name": "hidden-tests", "framework": "unittest", "timeout_seconds": 30,
                     "scoring": "all"}]},
        # Passing tests can still hide a hack: a solution that makes unittest skip or collect nothing.
        {"name": "logs", "kind": "environment",
         "checks": [{"type": "log_rules", "name": "test-log", "rules": [
             {"pattern": r"Ran 0 tests", "effect": "fail"},
             {"pattern": r"NO TESTS RAN", "effect": "fail"},
             {"pattern": r"OK \(skipped=", "effect": "fail"},
             {"pattern": r"MemoryError|RecursionError|Killed", "effect": "fail"},
         ]}]},
    ],
}

CITED_NUMBERS = {
    "pass_threshold": 0.8,
    "layers": [
        # A right number proves nothing about the citation: it goes on to the citation check. A wrong one decides.
        {"name": "answer", "kind": "exact", "continue_on_pass": True,
         "checks": [{"type": "numeric", "name": "answer-value", "reference": "{answer}", "rel_tolerance": 0.001,
                     "parse_scale": True}]},
        # The number is the exact layer's to judge (it may be derived: a difference of two cited figures is in
        # neither quote); this layer checks that the quotes are in the documents. All found: decided, no judge.
        # Some found: the judge reads them.
        {"name": "citations", "kind": "environment",
         "checks": [{"type": "citations", "name": "cited-span", "fuzzy_threshold": 0.9, "check_numbers": False}],
         "escalate": {"uncertain_low": 0.5, "uncertain_high": 0.9}},
        {"name": "judge", "kind": "judge",
         "checks": [{"type": "score_model", "name": "citation-judge", "model": "judge-small", "score_range": [0, 1],
                     "rubric": (
                         "The answer gives a number and quotes the sentence of the document it comes from. "
                         "Score 1 if the quoted text supports the number as stated (same value, unit and scale, "
                         "same fiscal year and company), 0.5 if it supports it only after a paraphrase or a unit "
                         "conversion the answer does not explain, and 0 if the quote is missing, comes from "
                         "another document or does not contain the number."
                     )}]},
    ],
}

MESH_GEOMETRY = {
    "pass_threshold": 0.8,
    "layers": [
        {"name": "geometry", "kind": "environment",
         "checks": [{"type": "mesh_geometry", "name": "solid", "require_watertight": True,
                     "volume_rel_tolerance": 0.02, "bbox_abs_tolerance": 0.05, "iou_threshold": 0.9,
                     "render_views": ["iso", "front"]}],
         "escalate": {"uncertain_low": 0.5, "uncertain_high": 0.9}},
        {"name": "judge", "kind": "judge",
         "checks": [{"type": "label_model", "name": "render-judge", "model": "judge-vision",
                     "prompt": ("Two renders (iso and front) of a mesh and the task that asked for it follow. "
                                "Label the mesh: matches if it is the requested solid with the requested "
                                "dimensions and placement, otherwise the label that names the main problem."),
                     "labels": ["matches", "wrong-shape", "wrong-dimensions", "wrong-placement", "broken-mesh"],
                     "passing_labels": ["matches"]}]},
    ],
}


def drafts() -> list[Draft]:
    return [
        Draft("verifier", "numeric-exact", "An exact integer answer: numeric match, then math-verify "
              "equivalence for forms the plain parser misses.", NUMERIC_EXACT),
        Draft("verifier", "number-only", "An exact integer read from the answer (its last number or marked "
              "answer), nothing evaluated: for questions that are themselves an expression.", NUMBER_ONLY),
        Draft("verifier", "python-unit-tests", "Hidden unittest tests against solution.py, then the test log "
              "for skipped or empty runs.", PYTHON_UNIT_TESTS),
        Draft("verifier", "cited-numbers", "A number read from a report: the value, the cited source span, "
              "and a judge for citations that only partly match.", CITED_NUMBERS),
        Draft("verifier", "mesh-geometry", "An exported mesh: watertight, volume and bounding box against the "
              "reference, with a vision judge on the renders when geometry is borderline.", MESH_GEOMETRY),
    ]
