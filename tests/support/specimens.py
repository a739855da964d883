"""Small, valid specs and task instances shared by the tests."""

IMAGE_SPEC = {"layers": [{"type": "base", "image": "python-3.11"},
                         {"type": "python_packages", "packages": ["numpy==2.1.3"]}],
              "limits": {"memory_mb": 256}, "warm_pool_size": 2}
VERIFIER_SPEC = {"layers": [
    {"name": "exact", "kind": "exact", "checks": [{"type": "numeric", "reference": "{answer}"}],
     "escalate": {"uncertain_low": 0.2, "uncertain_high": 0.8}},
    {"name": "judge", "kind": "judge", "checks": [{"type": "score_model", "model": "judge-small",
                                                     "rubric": "Is the arithmetic right?"}]},
]}
TEMPLATE_SPEC = {"prompt_template": "What is {a} + {b}?", "sandbox_image": "py-basic", "verifier": "numeric",
                 "limits": {"max_turns": 1, "max_tokens": 16, "max_seconds": 10}}
DOMAIN_SPEC = {"sampling_weight": 2.0, "templates": [{"template": "add-two", "weight": 1.0}]}


def addition_instances(n: int = 20) -> list[dict]:
    return [{"key": f"add-{i:05d}", "inputs": {"a": i, "b": i % 7}, "hidden": {"answer": i + i % 7}}
            for i in range(n)]


# A review rubric (registry kind `rubric`): a label set, an ordinal scale, free text, and a question on one step.
RUBRIC = {"questions": [
    {"key": "verdict", "type": "labels", "prompt": "Is the answer right?",
     "labels": ["correct", "wrong", "reward-hack", "unsafe", "format"]},
    {"key": "quality", "type": "ordinal", "prompt": "How good is it?", "labels": ["bad", "fair", "good"],
     "required": False},
    {"key": "notes", "type": "text", "prompt": "Anything else?", "required": False},
    {"key": "step_ok", "type": "pass_fail", "prompt": "Is this step right?", "scope": "step"},
]}
