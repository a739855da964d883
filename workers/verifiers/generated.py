"""The `generator_score` check: a generated task's answer scored by its generator library's own function, in the
sandbox.

A generated task (workers/rl/tasks/generators.py) carries in its hidden part what the library needs to score an
answer to it: library, version, dataset, config and the entry. The scoring runs in the template's sandbox image,
never in the worker: the answer is the model's, and reasoning-gym's scorers hand it to `eval` (binary_matrix,
n_queens, spiral_matrix, string_insertion) and to sympy's `parse_expr` (the algebra datasets, countdown, puzzle24),
which evaluates Python too. The image must have the library installed at the task's version (a python_packages
layer; its sandboxes import it before they count as warm, so a check costs a fork, not an import).

The answer is what the library's convention takes from the response: reasoning-gym's own `extract_answer`, the
text of the last <answer>...</answer> (None without one), handed to the dataset's `score_answer(answer, entry)`.
Scores travel back on lines that start with a nonce made for the run, one line per answer as soon as it is
scored, so an answer that hangs or kills its scorer costs only its own score; a sandbox that could not import
the library, or has another version of it, is an infrastructure error, never a reward.

`score_responses` scores many responses in one sandbox execution: the check scores one; the reference check at
publish (apps/task_import/generated.py) scores a dataset's references and empty answers in one run.

The sandbox keeps an answer that is code off the host, but not out of the reward: where a scorer evaluates the
answer, code in it would run beside the entry it is scored against and could read the reference answer from the
scorer's memory. So while an answer is scored, an audit hook (PEP 578: it cannot be removed, and code that is not
compiled cannot run to try) refuses to compile text the way eval, exec and sympy's parse_expr do (file name
"<string>"); the answer scores 0, its evidence says why. ast.literal_eval, which parses data without running it,
compiles as "<unknown>" and stays allowed. A dataset whose scorer runs even its own answers as code therefore
fails its reference check and is not published (apps/task_import/generated.py).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import replace

from workers.definitions.specs import GeneratorScore
from workers.sandbox import Execution, Status

from .types import INFRA_ERROR, Outcome

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
# The last sentence of a generated template's prompt: reasoning-gym's own convention for where the answer goes.
ANSWER_INSTRUCTION = "Give your final answer between <answer> and </answer> tags."
EVIDENCE_CHARS = 200
BATCH_SECONDS_PER_ANSWER = 0.5  # on top of one answer's timeout, for a batch of many (a reference check)
MAX_BATCH_SECONDS = 600.0
LINE_BYTES = 6 * (EVIDENCE_CHARS + 300) + 200  # the most one answer's line takes: nonce, answer, error (JSON-escaped)

DRIVERS = {"reasoning-gym": r'''
import importlib.metadata, json, math, signal, sys
request = json.loads(sys.stdin.read())
nonce = request["nonce"]
EVIDENCE_CHARS = request["evidence_chars"]

def say(message):
    print(nonce, json.dumps(message), flush=True)

import reasoning_gym
from reasoning_gym.utils import extract_answer

installed = importlib.metadata.version("reasoning-gym")
say({"ready": installed})

class TooLong(BaseException):  # not an Exception: a scorer's own `except Exception` cannot swallow it
    pass

def stop(signum, frame):
    raise TooLong()

signal.signal(signal.SIGALRM, stop)

scoring = {"armed": False, "ran_as_code": False}

def refuse_code(event, args):
    # Text compiled as "<string>" while an answer is scored is eval/exec/parse_expr at work on it (or on something
    # made from it): refused before it can run. Imports compile real files; literal_eval compiles "<unknown>".
    if scoring["armed"] and event == "compile" and len(args) > 1 and args[1] == "<string>":
        scoring["ran_as_code"] = True
        raise RuntimeError("refused to compile text while scoring an answer")

sys.addaudithook(refuse_code)
CODE_REFUSED = ("the scorer runs the answer as Python code (eval, exec or sympy's parse_expr), which could read the "
                "reference it is scored against: refused")
warmed = set()

def shown(answer):  # enough of the answer for the evidence; a long one must not fill the sandbox's output
    return answer if answer is None or len(answer) <= EVIDENCE_CHARS else answer[:EVIDENCE_CHARS] + "…"

datasets = {}
for index, item in enumerate(request["items"]):
    hidden = item["hidden"]
    if hidden["version"] != installed:
        say({"index": index, "version": hidden["version"]})
        continue
    answer = None
    try:
        signal.setitimer(signal.ITIMER_REAL, request["seconds"])
        key = json.dumps([hidden["dataset"], hidden["config"]], sort_keys=True)
        if key not in datasets:
            datasets[key] = reasoning_gym.create_dataset(hidden["dataset"], **hidden["config"])
        if key not in warmed:  # its first scoring imports what the scorer needs: unarmed, on the entry's own answer
            warmed.add(key)
            try:
                datasets[key].score_answer(hidden["entry"].get("answer"), hidden["entry"])
            except Exception:
                pass
        answer = extract_answer(item["response"])
        scoring.update(armed=True, ran_as_code=False)
        try:
            value = datasets[key].score_answer(answer, hidden["entry"])
        finally:
            scoring["armed"] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        if scoring["ran_as_code"]:
            raise RuntimeError(CODE_REFUSED)
        value = float(value)
        if not (math.isfinite(value) and 0 <= value <= 1):
            raise ValueError(f"the scorer gave {value!r}, not a number from 0 to 1")
        say({"index": index, "score": value, "answer": shown(answer)})
    except TooLong:
        say({"index": index, "error": f"scoring took longer than {request['seconds']:g} s", "answer": shown(answer)})
    except Exception as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        error = CODE_REFUSED if scoring["ran_as_code"] else f"the scorer raised {type(exc).__name__}: {str(exc)[:300]}"
        say({"index": index, "error": error, "answer": shown(answer)})
'''}


def answer_response(answer: str) -> str:
    """A response that gives `answer` where the generated tasks' convention looks for it."""
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def is_generated(hidden: dict) -> bool:
    return isinstance(hidden.get("entry"), dict) and hidden.get("library") in DRIVERS


def generator_score_check(spec: GeneratorScore, sample, item, context) -> Outcome:
    if not is_generated(item.hidden):
        return Outcome(value=None, status=INFRA_ERROR, evidence="generator_score scores generated tasks only; this "
                                                                "task's hidden part has no generator entry")
    (outcome,) = score_responses(context.pool, context.image, [(sample.response, item.hidden)],
                                 timeout_seconds=spec.timeout_seconds)
    return outcome


def score_responses(pool, image, items: list[tuple[str, dict]], *, timeout_seconds: float = 10) -> list[Outcome]:
    """An Outcome per (response, hidden) pair, scored in one execution in `image` (all of one library).

    An answer whose scoring raised, ran out of time or ended the program scores 0, the reason its evidence; a
    sandbox that could not run the library (none in the image, another version) is an infra error for all."""
    if pool is None or image is None:
        return [Outcome(value=None, status=INFRA_ERROR, evidence="no sandbox to score the answer in")] * len(items)
    if not items:
        return []
    libraries = {hidden.get("library") for _, hidden in items}
    if len(libraries) != 1 or not all(is_generated(hidden) for _, hidden in items):
        raise ValueError("score_responses takes generated tasks of one library")
    nonce = secrets.token_hex(16)
    request = {"nonce": nonce, "seconds": timeout_seconds, "evidence_chars": EVIDENCE_CHARS,
               "items": [{"response": response, "hidden": hidden} for response, hidden in items]}
    seconds = min(MAX_BATCH_SECONDS, timeout_seconds + BATCH_SECONDS_PER_ANSWER * (len(items) - 1))
    # A line per answer: room for all of them, however many a reference check sends.
    output = min(image.limits.output_hard_bytes // 2, max(image.limits.output_bytes, LINE_BYTES * (len(items) + 1)))
    limits = replace(image.limits, wall_seconds=seconds, cpu_seconds=seconds, output_bytes=output)
    result = pool.execute(image, Execution(program=DRIVERS[libraries.pop()], stdin=json.dumps(request).encode(),
                                           limits=limits))
    if result.status == Status.INFRA_ERROR:
        return [Outcome(value=None, status=INFRA_ERROR, evidence=result.reason)] * len(items)
    ready, said = None, {}
    for line in result.stdout.decode("utf-8", "replace").splitlines():
        if line.startswith(nonce + " "):
            message = json.loads(line[len(nonce) + 1:])
            if "ready" in message:
                ready = message["ready"]
            elif isinstance(message.get("index"), int):
                said.setdefault(message["index"], message)
    if ready is None:
        tail = result.stderr.decode("utf-8", "replace")[-400:]
        outcome = Outcome(value=None, status=INFRA_ERROR,
                          evidence=f"the sandbox could not run the scorer ({result.status}: {result.reason}) {tail}")
        return [outcome] * len(items)
    outcomes = []
    for index, (_, hidden) in enumerate(items):
        message = said.get(index)
        if message is None:
            outcomes.append(Outcome.scored(0, f"the scorer did not finish with this answer ({result.status}: "
                                              f"{result.reason})"))
        elif "version" in message:
            outcomes.append(Outcome(value=None, status=INFRA_ERROR, evidence=(
                f"the task was made with {hidden['library']} {message['version']}; the sandbox image has {ready}")))
        elif "error" in message:
            outcomes.append(Outcome.scored(0, f"{_answer_text(message)}: {message['error'][:EVIDENCE_CHARS]}"))
        else:
            outcomes.append(Outcome.scored(message["score"], f"{_answer_text(message)} scored {message['score']:g}"))
    return outcomes


def _answer_text(message: dict) -> str:
    answer = message.get("answer")
    if answer is None:
        return f"no {ANSWER_OPEN}...{ANSWER_CLOSE} in the response"
    return f"answer {answer!r}"
