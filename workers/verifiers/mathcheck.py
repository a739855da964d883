"""The `math` check: math-verify's parse and verify of the final answer (answers.py) against the reference.

math-verify guards itself with signal.alarm, which only works in a process's main thread, and sympy can run
for ever on a hostile answer (a power tower like 2^{2^{2^{2^{100}}}}). So its own timeouts are off
(parsing_timeout=None, timeout_seconds=None) and the whole parse-and-verify runs in a worker process of a
pebble ProcessPool, which kills the worker when `timeout_seconds` runs out and starts a fresh one:
- the answer ran past the limit, or killed its worker (memory): 0, status fail — the answer is hostile;
- the pool could not start or run the job at all: status infra_error, retried and never scored.
Workers come from a forkserver, not fork: the caller is multithreaded (the pool's own threads at least), and a
forked copy of a multithreaded process can deadlock. Each worker caps its address space, so a memory bomb
ends in a MemoryError inside the worker instead of the host's OOM killer.
A daemonic process cannot start processes, so under Celery the queue that verifies must run its workers with
--pool threads or solo, not prefork (the check says so in its infra_error). A script that calls the check needs
the usual `if __name__ == "__main__":` guard: the forkserver imports the main module.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import resource
import threading
from concurrent.futures import wait

from pebble import ProcessExpired, ProcessPool

from workers.definitions.specs import MathMatch

from .answers import ReferenceMissing, final_answer, reference_text
from .types import ERROR, INFRA_ERROR, Item, Outcome, Sample

WORKERS = max(1, min(4, os.cpu_count() or 1))
WORKER_MEMORY_BYTES = 2 * 1024**3
QUEUE_SECONDS = 30.0  # how long a job may wait for a free worker before the pool counts as broken
EVIDENCE_CHARS = 200
DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed")
FUNCTIONS = "sin|cos|tan|cot|sec|csc|arcsin|arccos|arctan|sinh|cosh|tanh|log|exp|sqrt|frac|pi|inf|infty|mod"
PROSE_WORD = re.compile(rf"(?<![\\A-Za-z])(?!(?:{FUNCTIONS})(?![A-Za-z]))[A-Za-z]{{3,}}")

_pool: ProcessPool | None = None
_pool_lock = threading.Lock()


def _start_worker() -> None:
    import math_verify  # noqa: F401 -- imported once per worker, not once per job

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled": we know, it is ours
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = WORKER_MEMORY_BYTES if hard == resource.RLIM_INFINITY else min(WORKER_MEMORY_BYTES, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def as_latex(text: str) -> str:
    """Bare math ("x^2 + 2x + 1", "2\\sqrt{2}") wrapped in $...$, so math-verify reads it whole rather than
    picking its last plain number; delimited LaTeX and prose ("12 apples") go through as they are, and
    math-verify finds the expression in them itself."""
    return text if DELIMITED.search(text) or PROSE_WORD.search(text) else f"${text}$"


def parse_and_verify(answer: str, reference: str) -> tuple[bool | None, str, str]:
    """(equal, what the answer parsed to, what the reference parsed to); equal is None when the reference
    itself does not parse. Runs in a worker: the strings are built here, since printing a sympy object can hang
    too."""
    from math_verify import parse, verify

    gold = parse(as_latex(reference), parsing_timeout=None)
    if not gold:
        return None, "", ""
    target = parse(as_latex(answer), parsing_timeout=None)
    expected = str(gold[-1])[:EVIDENCE_CHARS]
    if not target:
        return False, "", expected
    return verify(gold, target, timeout_seconds=None), str(target[-1])[:EVIDENCE_CHARS], expected


def _math_pool() -> ProcessPool:
    global _pool
    with _pool_lock:
        if _pool is None or not _pool.active:
            _pool = ProcessPool(max_workers=WORKERS, initializer=_start_worker,
                                context=multiprocessing.get_context("forkserver"))
        return _pool


def math_check(spec: MathMatch, sample: Sample, item: Item, context) -> Outcome:
    try:
        reference = reference_text(spec.reference, item)
    except ReferenceMissing as exc:
        return Outcome(value=None, status=ERROR, evidence=str(exc))
    answer = final_answer(sample.response)
    # math-verify reads \boxed{} and LaTeX delimiters itself, better than a cut-out fragment would read.
    text = answer.text if answer.source in ("json", "marker") else sample.response
    seconds = spec.timeout_seconds
    try:
        future = _math_pool().schedule(parse_and_verify, args=(text, reference), timeout=seconds)
    except Exception as exc:  # the pool itself failed: nothing the answer did
        hint = ("; a daemonic process (a Celery prefork child) cannot start workers: run this queue's Celery "
                "workers with --pool threads or solo") if "daemonic" in str(exc) else ""
        return Outcome(value=None, status=INFRA_ERROR, evidence=f"math worker pool unavailable: {exc!r}{hint}")
    done, _ = wait([future], timeout=seconds + QUEUE_SECONDS)
    if not done:
        future.cancel()
        return Outcome(value=None, status=INFRA_ERROR,
                       evidence=f"no math worker took the job within {seconds + QUEUE_SECONDS:g}s")
    error = future.exception()
    if isinstance(error, TimeoutError):
        return Outcome.scored(0, f"checking {answer.where} timed out after {seconds:g}s; the answer is too costly "
                                 "to evaluate")
    if isinstance(error, ProcessExpired):
        return Outcome.scored(0, f"the math worker died (exit code {error.exitcode}) evaluating {answer.where}")
    if isinstance(error, (MemoryError, RecursionError)):
        return Outcome.scored(0, f"evaluating {answer.where} failed with {type(error).__name__}")
    if error is not None:
        return Outcome(value=None, status=INFRA_ERROR, evidence=f"math worker failed: {error!r}")
    equal, found, expected = future.result()
    if equal is None:
        return Outcome(value=None, status=ERROR, evidence=f"math-verify cannot parse the reference {reference!r}")
    if not found:
        return Outcome.scored(0, f"no mathematical answer in {answer.where}; expected {expected}")
    return Outcome.scored(equal, f"{answer.where} reads {found}; expected {expected}")
