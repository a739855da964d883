"""Episodes as the environment server builds them for a trainer elsewhere (workers/environments), for the tests of
what the studio records and shows of a run trained elsewhere."""

from __future__ import annotations

import time
import uuid

from workers.rl.rollout.grading import LocalVerifier, grade_trajectory
from workers.rl.tasks.taskset import TaskSet
from workers.rl.types import ToolCall, ToolResult, Trajectory, TrajectoryStatus, Turn

TEMPLATE = "task_template/add-two@1"  # the registry fixture's template (tests/conftest.py)


def episode(tasks: TaskSet, key: str, answer: str, *, tool: bool = False, seconds: float = 2.0,
            status: TrajectoryStatus = TrajectoryStatus.OK) -> Trajectory:
    """One episode as the environment server builds it: the task's prompt, the turns the trainer's model wrote as
    its client reported them (text, no token ids), a tool call's sandbox result, and the verdict of the bundle's
    own verifier (its exact layer runs in this process)."""
    task = tasks.task(0, TEMPLATE, key)
    now = time.time()
    trajectory = Trajectory(id=str(uuid.uuid4()), run_id="", seq=0, sample=0, domain=task.domain,
                            template=task.template.key, task_key=task.item.key, task_hash=task.item_hash,
                            image=task.template.image.key, verifier=task.template.verifier_key, policy_version=0,
                            started_at=now - seconds, timings={"environment_assembly": 0.05})
    trajectory.turns = [Turn(role=m["role"], content=m["content"])
                        for m in task.template.messages(task.item, examples=False)]
    if tool:
        code = f"print({task.item.inputs['a']} + {task.item.inputs['b']})"
        trajectory.turns += [
            Turn(role="assistant", content="Let me compute it.", finish_reason="tool_calls",
                 tool_calls=[ToolCall(id="call_1", name="run_python", arguments={"code": code})]),
            Turn(role="tool", content=answer + "\n", tool_call_id="call_1", name="run_python",
                 result=ToolResult(status="ok", text=answer + "\n", exit_code=0, stdout=answer + "\n",
                                   wall_seconds=0.2, cpu_seconds=0.02))]
    trajectory.turns.append(Turn(role="assistant", content=answer, finish_reason="stop"))
    trajectory.status = status
    if status == TrajectoryStatus.ABANDONED:
        trajectory.status_reason = "the client's WebSocket closed before a final answer"
        trajectory.finished_at = now
    else:
        grade_trajectory(LocalVerifier(pool=None), task, trajectory)
    trajectory.costs.update(sandbox_cpu_seconds=0.02, total=0.001)
    return trajectory
