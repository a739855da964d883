"""Synthetic runs: metric points, events and trajectories that look like the engine's, for building and testing
the pages before (and beside) real runs. Written through the same services a worker uses (claim, then one
`run_step_record` per step), so what the pages show is exactly what a real run would make them show.

Each step archives a few trajectories: an arithmetic answer, a coding trajectory with `run_python` tool calls
and a unit-test verdict, and a 3D trajectory whose mesh verdict carries a rendered PNG.
"""

from __future__ import annotations

import io
import math
import random
import time
from functools import cache

from apps.runs.models import Run
from apps.runs.services import run_claim, run_create, run_finish, run_step_record
from workers.rl.models.chat_formats import CharTokenizer
from workers.rl.types import ToolCall, ToolResult, Trajectory, Turn, trajectory_id
from workers.verifiers import Verdict
from workers.verifiers.types import Component

DOMAINS = ("arithmetic", "python-coding", "3d-modelling", "document-qa")
IDLE_CAUSES = ("environment_assembly", "generation", "tools", "verification", "timeouts")


TOKENIZER = CharTokenizer()  # the demo model's own: the replay shows its tokens as it would a real run's

CODE = '''def running_max(xs):
    out, best = [], None
    for x in xs:
        best = x if best is None or x > best else best
        out.append(best)
    return out
'''


def run_synthetic_create(*, project, bundle, steps: int, name: str = "", actor=None) -> Run:
    return run_create(project=project, bundle=bundle, steps=steps, name=name or "synthetic", actor=actor, via="cli")


def synthetic_step_points(*, step: int, steps_total: int, rng: random.Random, domains=DOMAINS) -> dict[str, float]:
    """Every metric name the engine writes, with curves shaped like a run that learns."""
    progress = step / max(1, steps_total)
    points: dict[str, float] = {}
    per_domain = []
    for index, domain in enumerate(domains):
        ceiling = 0.55 + 0.1 * index % 0.4
        value = min(1.0, max(0.0, 0.2 + ceiling * (1 - math.exp(-4 * progress)) + rng.gauss(0, 0.04)))
        points[f"reward/{domain}"] = value
        per_domain.append(value)
    points["reward/mean"] = sum(per_domain) / len(per_domain)
    points["reward/slope_per_hour"] = 2.2 * math.exp(-4 * progress) + rng.gauss(0, 0.05)
    all_per_hour = 5200 + rng.gauss(0, 150)
    effective_fraction = max(0.1, 0.85 - 0.4 * progress + rng.gauss(0, 0.03))
    points["throughput/trajectories_per_hour"] = all_per_hour
    points["throughput/effective_trajectories_per_hour"] = all_per_hour * effective_fraction
    points["throughput/tokens_per_second"] = 410 + rng.gauss(0, 20)
    points["groups/effective_fraction"] = effective_fraction
    points["cost/per_task"] = 0.0021 + rng.gauss(0, 0.0001)
    points["cost/total"] = 0.0021 * 64 * step
    idle = {"environment_assembly": 0.08, "generation": 0.35, "tools": 0.18, "verification": 0.12, "timeouts": 0.03}
    for cause in IDLE_CAUSES:
        points[f"idle/{cause}"] = max(0.0, idle[cause] * (1 + rng.gauss(0, 0.25)))
    step_seconds = 1.6 + rng.gauss(0, 0.1)
    points["trainer/step_seconds"] = step_seconds
    points["trainer/busy_fraction"] = max(0.0, 1 - sum(points[f"idle/{c}"] for c in IDLE_CAUSES) / step_seconds)
    points["staleness/mean"] = 0.6 + rng.gauss(0, 0.05)
    points["staleness/max"] = float(rng.choice((1, 1, 1, 2)))
    points["policy/kl"] = 0.002 + 0.03 * progress + abs(rng.gauss(0, 0.002))
    points["policy/entropy"] = 1.9 - 0.9 * progress + rng.gauss(0, 0.03)
    points["policy/clip_fraction"] = 0.04 + abs(rng.gauss(0, 0.01))
    points["policy/grad_norm"] = 0.8 + abs(rng.gauss(0, 0.2))
    points["loss/policy"] = rng.gauss(0, 0.02)
    points["infra/retries"] = float(rng.random() < 0.1)
    points["infra/errors"] = 0.0
    return points


@cache
def render_png(view: str = "iso") -> bytes:
    """A real PNG of a box, as the mesh verifier renders one (matplotlib, headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection

    corners = [(x, y, z) for x in (0, 2) for y in (0, 1) for z in (0, 1)]
    faces = [[corners[i] for i in face] for face in
             ((0, 1, 3, 2), (4, 5, 7, 6), (0, 1, 5, 4), (2, 3, 7, 6), (0, 2, 6, 4), (1, 3, 7, 5))]
    figure = plt.figure(figsize=(3, 3), dpi=80)
    axes = figure.add_subplot(projection="3d")
    axes.add_collection3d(Poly3DCollection(faces, facecolor="#6f8fd8", edgecolor="#1d2430", alpha=0.9))
    axes.set(xlim=(0, 2), ylim=(0, 2), zlim=(0, 2), title=f"candidate ({view})")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return buffer.getvalue()


def _assistant(text: str, rng: random.Random, *, started: float, duration: float, tool_calls=(),
               finish: str = "stop") -> Turn:
    ids = TOKENIZER.encode(text)
    return Turn(role="assistant", content=text, token_ids=ids,
                logprobs=[-abs(rng.gauss(0.3, 0.5)) for _ in ids], tool_calls=list(tool_calls),
                finish_reason=finish, started_s=started, duration_s=duration)


def _component(layer, name, kind, value, status, evidence, latency_ms, weight=1.0) -> Component:
    return Component(layer=layer, name=name, type=kind, weight=weight, value=value, status=status,
                     evidence=evidence, latency_ms=latency_ms)


def synthetic_trajectories(*, run: Run, step: int, rng: random.Random, per_step: int = 3) -> list[Trajectory]:
    """`per_step` trajectories of this step (one draw each), cycling arithmetic, coding and 3D."""
    rows = []
    now = time.time()
    for index in range(per_step):
        seq = step * per_step + index
        kind = ("arithmetic", "python-coding", "3d-modelling")[seq % 3]
        maker = {"arithmetic": _arithmetic, "python-coding": _coding, "3d-modelling": _modelling}[kind]
        trajectory, artifacts = maker(rng)
        trajectory.id = trajectory_id(str(run.pk), seq, 0)
        trajectory.run_id, trajectory.seq, trajectory.sample = str(run.pk), seq, 0
        trajectory.policy_version = max(0, step - rng.choice((0, 0, 1)))
        trajectory.step = step
        trajectory.advantage = round((trajectory.reward or 0) - 0.5 + rng.gauss(0, 0.1), 3)
        trajectory.effective = True
        trajectory.started_at, trajectory.finished_at = now - trajectory.timings["total"], now
        trajectory.artifacts = artifacts
        rows.append(trajectory)
    return rows


def _base(domain, template, task_key, image, verifier) -> Trajectory:
    return Trajectory(id="", run_id="", seq=0, sample=0, domain=domain, template=template, task_key=task_key,
                      task_hash="0" * 64, image=image, verifier=verifier, policy_version=0)


def _arithmetic(rng: random.Random):
    a, b = rng.randrange(30), rng.randrange(30)
    answer = a + b if rng.random() < 0.7 else a + b + rng.choice((-1, 1))
    trajectory = _base("arithmetic", "task_template/add-two@1", f"add-{a}-{b}", "sandbox_image/python-3.11@1",
                       "verifier/numeric-exact@1")
    prompt = f"{a}+{b}="
    trajectory.prompt_ids = TOKENIZER.encode(prompt)
    trajectory.turns = [Turn(role="user", content=prompt, token_ids=trajectory.prompt_ids),
                        _assistant(str(answer), rng, started=0.01, duration=0.02)]
    reward = 1.0 if answer == a + b else 0.0
    status = "pass" if reward else "fail"
    trajectory.reward = reward
    trajectory.verdict = Verdict(reward=reward, status=status, layers_run=["exact"], stopped_because="decided",
                                 latency_ms=0.4, components=[
                                     _component("exact", "answer", "numeric", reward, status,
                                                "" if reward else f"expected {a + b}, got {answer}", 0.4)])
    trajectory.timings = {"queue": 0.01, "environment_assembly": 0.0, "generation": 0.02, "tools": 0.0,
                          "verification": 0.001, "total": 0.04}
    trajectory.costs = {"policy_seconds": 0.02, "sandbox_cpu_seconds": 0.0, "judge": 0.0, "total": 0.00002}
    return trajectory, {}


def _coding(rng: random.Random):
    trajectory = _base("python-coding", "task_template/python-functions@1", "running-max",
                       "sandbox_image/python-3.11@1", "verifier/python-unit-tests@1")
    prompt = "Write running_max(xs): the largest value seen so far, at each position."
    trajectory.prompt_ids = TOKENIZER.encode(prompt)
    first_try = CODE.replace("x > best", "x >= best") + "print(running_max([1, 3, 2]))\n"
    failing = rng.random() < 0.4
    stdout = "[1, 3, 3]\n"
    turns = [Turn(role="system", content="You write Python. Test with run_python before answering."),
             Turn(role="user", content=prompt, token_ids=trajectory.prompt_ids, started_s=0.0)]
    call = ToolCall(id="call_1", name="run_python", arguments={"code": first_try})
    turns.append(_assistant("Let me try it first.", rng, started=0.05, duration=0.9, tool_calls=[call],
                            finish="tool_calls"))
    turns.append(Turn(role="tool", content=stdout, token_ids=TOKENIZER.encode(stdout), tool_call_id="call_1",
                      name="run_python", started_s=0.95, duration_s=0.31,
                      result=ToolResult(status="ok", text=stdout, exit_code=0, stdout=stdout, wall_seconds=0.31,
                                        cpu_seconds=0.02, files=["main.py"])))
    bad = "print(running_max(None))\n"
    call2 = ToolCall(id="call_2", name="run_python", arguments={"code": CODE + bad})
    turns.append(_assistant("And the empty case:", rng, started=1.3, duration=0.6, tool_calls=[call2],
                            finish="tool_calls"))
    stderr = ("Traceback (most recent call last):\n  File \"main.py\", line 7, in <module>\n"
              "  File \"main.py\", line 3, in running_max\nTypeError: 'NoneType' object is not iterable\n")
    turns.append(Turn(role="tool", content=stderr, token_ids=TOKENIZER.encode(stderr), tool_call_id="call_2",
                      name="run_python", started_s=1.95, duration_s=0.28,
                      result=ToolResult(status="error", text=stderr, exit_code=1, stderr=stderr, wall_seconds=0.28,
                                        cpu_seconds=0.02, reason="exit code 1", files=["main.py"])))
    answer = "```python\n" + (CODE.replace("best = x if", "best = x if best is None and") if failing else CODE) + "```"
    turns.append(_assistant(answer, rng, started=2.3, duration=1.4))
    trajectory.turns = turns
    passed = 3 if failing else 4
    reward = passed / 4
    status = "pass" if reward == 1 else "partial"
    evidence = "4 of 4 tests passed" if not failing else (
        "3 of 4 tests passed\nFAIL test_increasing: [1, 2, 3] -> [1, 1, 1], expected [1, 2, 3]")
    trajectory.reward = reward
    trajectory.verdict = Verdict(reward=reward, status=status, layers_run=["exact"], stopped_because="decided",
                                 latency_ms=412.0, components=[
                                     _component("exact", "hidden tests", "unit_tests", reward, status, evidence,
                                                412.0)])
    trajectory.timings = {"queue": 0.05, "environment_assembly": 0.12, "generation": 2.9, "tools": 0.59,
                          "verification": 0.41, "total": 4.1}
    trajectory.costs = {"policy_seconds": 2.9, "sandbox_cpu_seconds": 0.5, "judge": 0.0, "total": 0.0031}
    return trajectory, {}


def _modelling(rng: random.Random):
    trajectory = _base("3d-modelling", "task_template/primitive-solids@1", "box-2x1x1",
                       "sandbox_image/cad-python@1", "verifier/mesh-geometry@1")
    prompt = "Model a solid box 2 x 1 x 1 with its corner at the origin. Write the mesh with trimesh."
    trajectory.prompt_ids = TOKENIZER.encode(prompt)
    script = "import trimesh\nmesh = trimesh.creation.box(extents=(2, 1, 1))\nmesh.apply_translation((1, .5, .5))\n" \
             "mesh.export('out.stl')\n"
    call = ToolCall(id="call_1", name="run_python", arguments={"code": script})
    stdout = "wrote out.stl (12 faces)\n"
    trajectory.turns = [
        Turn(role="user", content=prompt, token_ids=trajectory.prompt_ids),
        _assistant("I'll build it with trimesh.", rng, started=0.04, duration=1.1, tool_calls=[call],
                   finish="tool_calls"),
        Turn(role="tool", content=stdout, token_ids=TOKENIZER.encode(stdout), tool_call_id="call_1",
             name="run_python", started_s=1.2, duration_s=0.8,
             result=ToolResult(status="ok", text=stdout, exit_code=0, stdout=stdout, wall_seconds=0.8, cpu_seconds=0.6,
                               files=["out.stl"])),
        _assistant("The box is in out.stl.", rng, started=2.05, duration=0.3)]
    iou = round(0.9 + rng.random() * 0.1, 3)
    components = [
        _component("exact", "watertight", "mesh_geometry", 1.0, "pass", "watertight, 12 faces", 35.0, weight=0.0),
        _component("environment", "shape", "mesh_geometry", iou, "pass" if iou >= 0.99 else "partial",
                   f"volume 2.000 (expected 2.000); extents 2×1×1; IoU {iou}", 610.0)]
    trajectory.reward = iou
    trajectory.verdict = Verdict(reward=iou, status=components[-1].status, components=components,
                                 layers_run=["exact", "environment"], stopped_because="decided",
                                 latency_ms=645.0)
    trajectory.timings = {"queue": 0.02, "environment_assembly": 0.4, "generation": 1.4, "tools": 0.8,
                          "verification": 0.65, "total": 3.3}
    trajectory.costs = {"policy_seconds": 1.4, "sandbox_cpu_seconds": 1.3, "judge": 0.0, "total": 0.0024}
    return trajectory, {"geometry/solid/iso.png": render_png("iso")}


def run_synthetic_steps(*, run: Run, steps: int, attempt: int | None = None, seconds_per_step: float = 0.0,
                        trajectories_per_step: int = 3, seed: int = 0, finish: bool = True, on_step=None) -> int:
    """Write `steps` steps after the run's current one, one transaction each, like a worker: under `attempt`,
    or a fresh claim. Returns the attempt, to write more steps later."""
    rng = random.Random(seed)
    if attempt is None:
        attempt = run_claim(run_id=run.pk, stale_after=0)
    if attempt is None:
        raise RuntimeError(f"{run} could not be claimed (status {run.status})")
    start = Run.objects.get(pk=run.pk).step
    for step in range(start + 1, start + steps + 1):
        events = [("checkpoint_saved", f"checkpoint at step {step}", {})] if step % 50 == 0 else []
        written = time.time()
        run_step_record(run_id=run.pk, attempt=attempt, step=step, wall_time=written,
                        points=synthetic_step_points(step=step, steps_total=run.steps_total, rng=rng),
                        trajectories=synthetic_trajectories(run=run, step=step, rng=rng,
                                                            per_step=trajectories_per_step),
                        events=events)
        if on_step is not None:
            on_step(step, written)
        if seconds_per_step:
            time.sleep(seconds_per_step)
    if finish:
        run_finish(run_id=run.pk, attempt=attempt,
                   status="completed" if start + steps >= run.steps_total else "paused")
    return attempt
