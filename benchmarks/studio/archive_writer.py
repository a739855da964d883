"""What `bench archive`'s writers write, and the entry point of its concurrent writer processes.

The writer processes are spawned (a fresh interpreter), so this module imports nothing of Django's at its top:
`writer_process` sets Django up first, on the caller's database, then imports the models and writes. The
trajectories it writes are built here (`agentic_trajectory`, Django-free) for archive.py and the writers alike:
archive.py imports this module, never the other way.
"""

from __future__ import annotations

import random
import time

from workers.rl.types import ToolCall, ToolResult, Trajectory, Turn, trajectory_id
from workers.verifiers import Verdict
from workers.verifiers.types import Component

PROMPT = ("Write a function `merge_intervals(intervals)` that merges overlapping closed intervals and returns them "
          "sorted. Test it with run_python before you answer. ")


def agentic_trajectory(*, run_id: str, seq: int, step: int, rng: random.Random, artifact: bytes | None = None
                       ) -> Trajectory:
    """One archived trajectory of realistic size: four turns (400 sampled tokens with logprobs), a tool call and
    its sandbox result, a verdict of three components."""
    def tokens(n):
        return [rng.randrange(32, 50_000) for _ in range(n)]

    def assistant(text, n, **extra):
        return Turn(role="assistant", content=text, token_ids=tokens(n),
                    logprobs=[-abs(rng.gauss(0.3, 0.5)) for _ in range(n)], **extra)

    code = "def merge_intervals(intervals):\n" + "    pass  # a sorted sweep over the starts\n" * 12
    stdout = "[[1, 6], [8, 10], [15, 18]]\n" * 4
    prompt_ids = tokens(120)
    reward = rng.choice((0.0, 0.5, 1.0))
    status = "pass" if reward == 1 else "fail" if reward == 0 else "partial"
    verdict = Verdict(reward=reward, status=status, layers_run=["format", "exact", "judge"],
                      stopped_because="all layers ran", latency_ms=812.0, components=[
                          Component(layer="format", name="fenced code", type="regex", weight=0.0, value=1.0,
                                    status="pass", evidence="one ```python block", latency_ms=0.2),
                          Component(layer="exact", name="hidden tests", type="unit_tests", weight=1.0, value=reward,
                                    status=status, evidence=f"{int(reward * 4)} of 4 tests passed\nFAIL "
                                    "test_touching: [[1, 2], [2, 3]] -> [[1, 2], [2, 3]], expected [[1, 3]]",
                                    latency_ms=402.0),
                          Component(layer="judge", name="readable", type="judge", weight=0.2, value=0.8,
                                    status="pass", evidence="Clear names; the sweep is explained in one line.",
                                    latency_ms=410.0)])
    return Trajectory(
        id=trajectory_id(run_id, seq, 0), run_id=run_id, seq=seq, sample=0, domain="python-coding",
        template="task_template/python-functions@1", task_key=f"merge-intervals-{seq % 500:03d}",
        task_hash="0" * 64, image="sandbox_image/python-3.11@1", verifier="verifier/python-unit-tests@1",
        policy_version=max(0, step - 1), prompt_ids=prompt_ids,
        turns=[Turn(role="user", content=PROMPT, token_ids=prompt_ids),
               assistant("Let me try a first version.", 150, finish_reason="tool_calls", started_s=0.1,
                         duration_s=1.2, tool_calls=[ToolCall(id="call_1", name="run_python",
                                                              arguments={"code": code})]),
               Turn(role="tool", content=stdout, token_ids=tokens(40), tool_call_id="call_1", name="run_python",
                    started_s=1.3, duration_s=0.3, result=ToolResult(status="ok", text=stdout, exit_code=0,
                                                                     stdout=stdout, wall_seconds=0.3, cpu_seconds=0.02,
                                                                     files=["main.py"])),
               assistant(f"```python\n{code}```", 250, finish_reason="stop", started_s=1.6, duration_s=2.1)],
        reward=reward, verdict=verdict, step=step, advantage=round(reward - 0.5, 3), effective=True,
        timings={"queue": 0.05, "environment_assembly": 0.1, "generation": 3.3, "tools": 0.3,
                 "verification": 0.8, "total": 4.6},
        costs={"policy_seconds": 3.3, "sandbox_cpu_seconds": 0.4, "judge": 0.0004, "total": 0.003},
        artifacts={"views/iso.png": artifact} if artifact else {},
        started_at=time.time() - 4.6, finished_at=time.time())


def writer_process(database: dict, run_id, attempt: int, steps: int, seed: int, ready, go, results) -> None:
    import django
    from django.conf import settings

    django.setup()
    settings.DATABASES["default"].update(database)  # the caller's (under pytest, the test database)
    writer_steps(run_id, attempt, steps, seed, ready, go, results)


def writer_steps(run_id, attempt: int, steps: int, seed: int, ready, go, results) -> None:
    """One run's worker: builds its steps, waits for the start, writes them (in a process of its own, Django set
    up)."""
    from django.db import connection

    from apps.operations.synthetic import synthetic_step_points
    from apps.runs.models import Run
    from apps.runs.services import run_step_record

    announced = False
    try:
        run = Run.objects.get(pk=run_id)
        rng = random.Random(seed)
        batches = [[agentic_trajectory(run_id=str(run.pk), seq=step * 64 + i, step=step, rng=rng)
                    for i in range(64)] for step in range(1, steps + 1)]
        ready.put(True)
        announced = True
        go.wait()
        began = time.perf_counter()
        for step, batch in enumerate(batches, start=1):
            run_step_record(run_id=run.pk, attempt=attempt, step=step, wall_time=time.time(),
                            points=synthetic_step_points(step=step, steps_total=steps, rng=rng), trajectories=batch)
        results.put((len(batches) * 64, time.perf_counter() - began, ""))
    except Exception as exc:  # noqa: BLE001 -- reported in the figures
        if not announced:
            ready.put(False)
        results.put((0, 0.0, repr(exc)))
    finally:
        connection.close()
