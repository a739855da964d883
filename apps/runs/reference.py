"""The reference check: a bundle's own reference answers through the real sandboxes and verifiers.

Before a team trains on a bundle, each template's reference answers (canonical solutions, reference scripts,
cited answers) should pass its verifier in its sandbox image; a template whose references fail has a broken
task, image or verifier, and a run on it would learn from noise (SWE-bench validates its gold patches the same
way). The check is a run of its own, `model: builtin:reference`, of one step: the assistant's turns are the
task's reference instead of samples — the canonical solution first run on the prompt's example with the
template's tool, when it has one, in the sandbox, then the answer — and everything else is what a training run
does: the same tool runner, the same verification (`workers.rl.pipeline.verify_trajectory`), the same archive,
pages and replay (with the rendered views of a 3D answer). Nothing is trained. The run's events name every
template whose references did not all pass.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings

from workers.rl.agent import record_tool_result
from workers.rl.base_model import reference_turns
from workers.rl.config import REFERENCE_MODEL, RunConfig
from workers.rl.metrics import Prices, trajectory_cost
from workers.rl.pipeline import LocalVerifier, TaskCatalog, verify_trajectory
from workers.rl.tools import SandboxToolRunner, parse_tool_calls
from workers.rl.types import Task, ToolCall, Trajectory, Turn, trajectory_id
from workers.sandbox import SandboxPool
from workers.sandbox.backends import backend_named

from . import services
from .driver import DatabaseTracker, _fail, _judge
from .models import EventKind, Run, RunStatus
from .pinned import pinned_bundle


def _reference_answers(task: Task) -> list[str] | None:
    """The assistant's messages of the task's reference, calling the template's tool first when it has one (the
    canonical solution run on the prompt's example); None if the task has no reference. The tool's output is
    left out: it comes from the sandbox, never from here."""
    turns = reference_turns(tools=list(task.template.tools), inputs=task.item.inputs, hidden=task.item.hidden,
                            rng=random.Random(0), tool_call_fraction=1.0)
    return None if turns is None else [m["content"] for m in turns if m["role"] == "assistant"]


def reference_tasks(pinned, *, per_template: int) -> list[tuple[Task, list[str]]]:
    """The first `per_template` tasks (by key) of every template that have a reference, with its messages."""
    catalog = TaskCatalog(pinned.templates, pinned.item, pinned.item_hash)
    chosen: list[tuple[Task, list[str]]] = []
    for template_key in sorted(pinned.templates):
        found = 0
        for task_key in sorted(pinned.items[template_key]):
            if found == per_template:
                break
            task = catalog.task(len(chosen), template_key, task_key)
            answers = _reference_answers(task)
            if answers is not None:
                chosen.append((task, answers))
                found += 1
    return chosen


def reference_rollout(run_id: str, task: Task, answers: list[str], tool_runner) -> Trajectory:
    """A trajectory whose assistant turns are the reference's `answers`, and whose tool turns are what the
    sandbox answered to the reference's calls (the same tool runner and accounting as a training rollout's)."""
    template, started = task.template, time.monotonic()
    trajectory = Trajectory(id=trajectory_id(run_id, task.seq, 0), run_id=run_id, seq=task.seq, sample=0,
                            domain=template.domain, template=template.key, task_key=task.item.key,
                            task_hash=task.item_hash, image=template.image.key, verifier=template.verifier_key,
                            policy_version=0, started_at=time.time(), step=1,
                            turns=[Turn(role=m["role"], content=m["content"]) for m in template.messages(task.item)])
    tools = list(template.tools)
    for index, text in enumerate(answers):
        calls = parse_tool_calls(text, tools) if tools else []
        trajectory.turns.append(Turn(
            role="assistant", content=text, finish_reason="tool_calls" if calls else "stop",
            started_s=round(time.monotonic() - started, 4),
            tool_calls=[ToolCall(id=f"call-{index}-{n}", name=c.name, arguments=c.arguments)
                        for n, c in enumerate(calls)]))
        for call in trajectory.turns[-1].tool_calls:
            call_started = time.monotonic()
            result = tool_runner.run(template.image, call.name, call.arguments)
            if record_tool_result(trajectory, call, result, call_started=call_started, started=started) is None:
                return trajectory
    trajectory.timings["rollout"] = time.monotonic() - started
    return trajectory


def reference_check(*, run_id, attempt: int, per_template: int) -> dict:
    """Verify `per_template` reference answers of every template of the run's bundle; archive them as the
    run's one step and finish the run. Returns the summary: per template, references checked, passed, failed
    (graded below 1) and ungraded (the verifier could not decide), and the first that did not pass."""
    run = Run.objects.select_related("bundle").get(pk=run_id)
    config = RunConfig.from_dict(run.config)
    if config.model != REFERENCE_MODEL:
        raise ValueError(f"run {run.name} is a training run (model {config.model}), not a reference check")
    tracker = DatabaseTracker(run.pk, attempt)
    pool = None
    try:
        pinned = pinned_bundle(bundle=run.bundle, config=config)
        chosen = reference_tasks(pinned, per_template=per_template)
        if not chosen:
            raise ValueError(f"no task of {run.bundle.ref} has a reference answer to check")
        pool = SandboxPool(backend_named(settings.SANDBOX_BACKEND), status_dir=settings.SANDBOX_STATUS_DIR)
        for template in pinned.templates.values():
            pool.warm(template.image)
        # Verified here, in this process's sandbox pool, even where training runs verify on Celery workers: a
        # command run from a shell should not wait on a queue that may have no worker yet.
        verifier = LocalVerifier(pool, _judge())
        tool_runner = SandboxToolRunner(pool, max_output_chars=config.max_tool_output_chars)

        def check(task: Task, answers: list[str]) -> Trajectory:
            trajectory = reference_rollout(str(run.pk), task, answers, tool_runner)
            verify_trajectory(verifier, task, trajectory)
            return trajectory

        with ThreadPoolExecutor(max_workers=config.verify_concurrency, thread_name_prefix="reference") as threads:
            trajectories = list(threads.map(check, *zip(*chosen, strict=True)))
        prices = Prices(gpu_per_hour=settings.GPU_PRICE_PER_HOUR,
                        sandbox_cpu_per_hour=settings.SANDBOX_CPU_PRICE_PER_HOUR)
        templates: dict[str, dict] = {}
        for trajectory in trajectories:
            trajectory_cost(trajectory, prices)
            entry = templates.setdefault(trajectory.template, {"domain": trajectory.domain, "checked": 0,
                                                               "passed": 0, "failed": 0, "ungraded": 0,
                                                               "first_problem": None})
            entry["checked"] += 1
            # Ungraded: the verifier could not decide (no judge configured, a sandbox that would not start);
            # that says nothing against the reference, but the template cannot be trained on as it stands.
            outcome = ("passed" if trajectory.reward == 1.0 else "ungraded" if trajectory.reward is None
                       else "failed")
            entry[outcome] += 1
            if outcome != "passed" and (entry["first_problem"] is None or
                                        (outcome == "failed" and entry["first_problem"]["outcome"] != "failed")):
                entry["first_problem"] = {"task": trajectory.task_key, "outcome": outcome,
                                          "why": trajectory.status_reason or trajectory.verdict.get("stopped_because")}
        # Rewards of the graded references only, as a run's reward/* are: an ungraded one is no zero.
        rewards: dict[str, list[float]] = {}
        for trajectory in trajectories:
            if trajectory.reward is not None:
                rewards.setdefault(trajectory.domain, []).append(trajectory.reward)
        points = {f"reward/{domain}": sum(r) / len(r) for domain, r in rewards.items()}
        graded = [r for domain_rewards in rewards.values() for r in domain_rewards]
        if graded:
            points["reward/mean"] = sum(graded) / len(graded)
        events = [(EventKind.REFERENCE_FAILED,
                   f"{key}: {e['passed']}/{e['checked']} references passed, {e['failed']} failed, "
                   f"{e['ungraded']} could not be graded; {e['first_problem']['task']}: {e['first_problem']['why']}",
                   {"template": key, **e})
                  for key, e in templates.items() if e["first_problem"]]
        tracker.step(step=1, wall_time=time.time(), points=points, trajectories=trajectories, events=events)
        summary = {"run": str(run.pk), "outcome": "completed", "kind": "reference check",
                   **{outcome: sum(e[outcome] for e in templates.values())
                      for outcome in ("checked", "passed", "failed", "ungraded")}, "templates": templates}
        services.run_finish(run_id=run.pk, attempt=attempt, status=RunStatus.COMPLETED, summary=summary)
        return summary
    except Exception as exc:
        _fail(run.pk, attempt, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if pool is not None:
            pool.close()
