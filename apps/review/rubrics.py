"""What a rubric (registry kind `rubric`, workers/definitions/specs.py RubricSpec) accepts as answers."""

from __future__ import annotations

from workers.rl.rollout.feedback import OUTCOMES

MAX_TEXT = 10_000

# The question a rubric asks to have repair trajectories labelled "fixed by feedback / guessed / gave up". Its labels
# are repair_outcome's (workers/rl/rollout/feedback.py), so a label and the metric speak of the same thing, and the
# item page can show beside it what the tool results say.
REPAIR_QUESTION = {
    "key": "repair", "type": "labels", "prompt": "How did it reach its fix?",
    "instructions": "fixed_by_feedback: a test run failed, the edit answered what the failure showed, and a later "
                    "run passed. guessed: solved, but not from the tests' feedback (it edited before running them, or "
                    "its edit does not follow from the failure). gave_up: not solved. Leave it for a trajectory that "
                    "neither runs tests nor edits code.",
    "labels": list(OUTCOMES), "required": False}


def questions(rubric_spec: dict, scope: str) -> list[dict]:
    return [q for q in rubric_spec["questions"] if q.get("scope", "trajectory") == scope]


def answer_problems(rubric_spec: dict, answers, *, scope: str) -> list[tuple[str, str]]:
    """(field, problem) for every answer that does not fit the rubric's questions of this scope; [] if all do."""
    if not isinstance(answers, dict):
        return [("answers", "must map question keys to answers")]
    asked = {q["key"]: q for q in questions(rubric_spec, scope)}
    problems = [(f"answers.{key}", f"no {scope} question {key!r} in this rubric; it asks "
                                   f"{', '.join(asked) or 'nothing'}") for key in answers if key not in asked]
    for key, question in asked.items():
        value = answers.get(key)
        where = f"answers.{key}"
        if value is None or value == "":
            if question.get("required", True):
                problems.append((where, "required"))
            continue
        kind = question["type"]
        if kind == "pass_fail" and not isinstance(value, bool):
            problems.append((where, f"true or false, not {value!r}"))
        elif kind in ("labels", "ordinal") and value not in question["labels"]:
            problems.append((where, f"one of {', '.join(question['labels'])}, not {value!r}"))
        elif kind == "text" and (not isinstance(value, str) or len(value) > MAX_TEXT):
            problems.append((where, f"text of at most {MAX_TEXT:,} characters"))
    return problems


def asks_repair(question: dict) -> bool:
    """Whether `question` asks a trajectory's repair outcome: its labels are repair_outcome's (any key, any order)."""
    return question["type"] == "labels" and sorted(question["labels"]) == sorted(OUTCOMES)
