"""`bench domains`: the studio at 100 and 1,000 domains (issue 43), beside the same measures at 10.

For each size, in a transaction rolled back at the end (so it runs against any database):
- `publish`: the synthetic domains of tests/support/many_domains.py (each its own template of a few addition
  tasks, twelve categories) published through the registry's services, their image, verifier and a bundle over
  them; then the bundle alone published again (`bundle_publish`: its closure resolved, the lock written), and its
  closure resolved without a write (`closure`: the bundle's spec check);
- `export` and `import`: the project written as files and imported into a new project (every definition
  published again from its history);
- `pin`: what a run does first, the bundle's tasks and domain mix read for a GRPO config with category weights
  and quotas;
- `scheduler`: the draw of one step's tasks (p50/p95 over `Workload.scheduler_steps` steps, with the curriculum
  learning from made-up rewards: some domains always solved, some never) at 8 groups a step (GRPOConfig's
  default) and at 64, and the state the training loop takes every step;
- `step_overhead`: what one training step does outside generation, verification and the trainer's update, with the
  engine's own functions — the draws, the curriculum's observations, advantages, the step's metric points and
  events, the checkpoint state the loop keeps — on made-up trajectories;
- `run_page`: a GRPO run of `Workload.run_steps` steps written like a worker writes them (run_step_record:
  reward/<domain> for the domains each step drew, one trajectory per group), then its page, its domains endpoint
  (the first page of the table) and the live message of a step: server time (p50 of `Workload.page_repeats`, and
  the first request) and bytes;
- `leaderboard`: the bundle as an eval suite with three evaluations scoring every domain, then the suite's page.

Targets (issue 43): at 1,000 domains the scheduler's draw under 5 ms a step, the run page's first paint under 1 s
(its server time here), its live updates no larger than at 10 domains.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse

from apps.accounts.services import project_create
from apps.evals.models import Evaluation, TargetKind
from apps.evals.suites import suite_key
from apps.operations.synthetic import synthetic_step_points
from apps.registry.files import export_project, import_directory
from apps.registry.models import Version
from apps.registry.pins import bundle_tasks
from apps.registry.services import spec_check, version_publish
from apps.runs.models import Run, RunKind, RunStatus
from apps.runs.services import run_claim, run_create, run_step_record
from apps.trajectories.models import Trajectory as TrajectoryRow
from tests.support.many_domains import CATEGORIES, publish_many_domains
from workers.rl.config import GRPOConfig
from workers.rl.rollout.collectors import Draws
from workers.rl.rollout.metrics import RunCounters, step_events, step_points
from workers.rl.tasks.scheduler import Curriculum, ScheduledTask, Scheduler
from workers.rl.training.trainer import assign_advantages
from workers.rl.types import Trajectory, Turn, trajectory_id
from workers.verifiers import Verdict

BASELINE = 10  # domains: what the live updates and the step's overhead at larger sizes are compared with
INSTANCES = 8  # task instances per template
GROUP_SIZE = 8
EVALUATIONS = ("model-a", "model-b", "model-c")
OVERHEAD_RUN = "00000000-0000-4000-8000-00000000d0a1"  # the made-up run of the step overhead's trajectories


@dataclass(frozen=True)
class Workload:
    """How much each measure does (the test runs a small one)."""

    scheduler_steps: int = 200
    overhead_steps: int = 50
    run_steps: int = 50
    run_groups: int = 64  # groups a step of the measured run draws: its reward/<domain> points
    page_repeats: int = 5
    large_step: int = 64  # groups of the larger step the scheduler and the step's overhead are measured at too


class _Rollback(Exception):
    pass


def run(*, domains: list[int] | None = None, workload: Workload = Workload(), **_) -> dict:
    sizes = sorted({BASELINE, *(domains or (100, 1000))})
    result: dict = {"database": connection.vendor, "workload": asdict(workload), "sizes": {}}
    for count in sizes:
        result["sizes"][str(count)] = measure(count, workload)
    baseline = result["sizes"][str(BASELINE)]
    largest = result["sizes"][str(sizes[-1])]
    result["targets"] = {
        "domains": sizes[-1],
        "scheduler_p95_ms_under_5": largest["scheduler"]["groups_8"]["draw_ms"]["p95"] < 5,
        "run_page_server_ms_under_1000": largest["run_page"]["page"]["ms_first"] < 1000,
        "live_update_no_larger_than_at_10": largest["run_page"]["live_update_bytes"]
        <= baseline["run_page"]["live_update_bytes"],
    }
    return result


def measure(count: int, workload: Workload = Workload()) -> dict:
    """Every figure at `count` domains, in a transaction rolled back afterwards."""
    figures: dict = {}
    try:
        with transaction.atomic():
            user = get_user_model().objects.create_user(f"bench-domains-{count}")
            project = project_create(team_slug="bench", slug=f"bench-domains-{count}", name="bench", owner=user)
            with _measured(figures, "publish") as publish:
                published = publish_many_domains(project=project, author=user, count=count, instances=INSTANCES)
            publish["ms_per_domain"] = round(publish["ms"] / count, 2)
            members = {"members": [f"domain/{slug}@latest" for slug in published.domains]}
            with _measured(figures, "bundle_publish"):
                version_publish(project=project, kind="bundle", slug="again", spec=members, author=user)
            with _measured(figures, "closure"):
                spec_check(project=project, kind="bundle", slug="closure", spec=members)
            with tempfile.TemporaryDirectory() as directory:
                with _measured(figures, "export"):
                    export_project(project=project, directory=Path(directory))
                with _measured(figures, "import"):
                    import_directory(directory=Path(directory), project_slug=f"bench-domains-{count}-copy",
                                     actor=user)
            config = GRPOConfig(category_weights={CATEGORIES[0]: 2.0},
                                category_quotas={category: 0.25 for category in set(published.categories.values())})
            bundle = Version.objects.get(pk=published.bundle.pk)  # read afresh, as a run's worker reads it
            with _measured(figures, "pin"):
                tasks = bundle_tasks(bundle=bundle, config=config)
            steps = (config.groups_per_step, workload.large_step)
            figures["scheduler"] = {f"groups_{groups}": _scheduler(tasks, config, groups=groups,
                                                                   steps=workload.scheduler_steps)
                                    for groups in steps}
            figures["step_overhead"] = {f"groups_{groups}": _step_overhead(tasks, config, groups=groups,
                                                                           steps=workload.overhead_steps)
                                        for groups in steps}
            figures["run_page"] = _run_page(project=project, user=user, bundle=bundle, tasks=tasks, config=config,
                                            workload=workload)
            figures["leaderboard"] = _leaderboard(project=project, user=user, members=members,
                                                  repeats=workload.page_repeats)
            raise _Rollback
    except _Rollback:
        pass
    return figures


# --- measuring ------------------------------------------------------------------------------------------------

@contextmanager
def _measured(figures: dict, name: str):
    """Time and count the queries of the block into figures[name] = {"ms", "queries"}."""
    queries = [0]

    def count(execute, sql, params, many, context):
        queries[0] += 1
        return execute(sql, params, many, context)

    entry = figures[name] = {}
    began = time.perf_counter()
    with connection.execute_wrapper(count):
        yield entry
    entry.update(ms=round((time.perf_counter() - began) * 1000, 1), queries=queries[0])


def _percentiles(samples_ms: list[float]) -> dict:
    ordered = sorted(samples_ms)
    return {"p50": round(statistics.median(ordered), 3),
            "p95": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 3),
            "max": round(ordered[-1], 3)}


def _solved(domain: str, task_key: str, step: int, rng: random.Random) -> list[float]:
    """Made-up rewards of a group: a third of the domains always solved, a third never, the rest by chance."""
    kind = sum(map(ord, domain)) % 3
    if kind == 0:
        return [1.0] * GROUP_SIZE
    if kind == 1:
        return [0.0] * GROUP_SIZE
    return [float(rng.random() < 0.5) for _ in range(GROUP_SIZE)]


def _scheduler(tasks, config: GRPOConfig, *, groups: int, steps: int) -> dict:
    """One step's draw and the state the loop takes after it, over `steps` steps."""
    scheduler = Scheduler(tasks.domains, seed=config.seed, curriculum=Curriculum(),
                          category_quotas=config.category_quotas)
    rng = random.Random(0)
    draws, states = [], []
    for step in range(steps):
        began = time.perf_counter()
        batch = scheduler.sample(groups)
        draws.append((time.perf_counter() - began) * 1000)
        for task in batch:
            scheduler.curriculum.observe(task, _solved(task.domain, task.task_key, step, rng))
        began = time.perf_counter()
        scheduler.state()
        states.append((time.perf_counter() - began) * 1000)
    curriculum = scheduler.curriculum
    return {"draw_ms": _percentiles(draws), "state_ms": _percentiles(states),
            "tasks_observed": len(curriculum.pass_rates), "stale_templates": len(curriculum.stale_templates)}


def _trajectory(task, sample: int, reward: float, *, run_id: str = OVERHEAD_RUN) -> Trajectory:
    answer = "7" if reward else "8"
    trajectory = Trajectory(id=trajectory_id(run_id, task.seq, sample), run_id=run_id, seq=task.seq, sample=sample,
                            domain=task.template.domain, template=task.template.key, task_key=task.item.key,
                            task_hash=task.item_hash, image=task.template.image.key,
                            verifier=task.template.verifier_key, policy_version=0, prompt_ids=[1, 2, 3])
    trajectory.turns = [Turn(role="user", content="3+4=", token_ids=[1, 2, 3]),
                        Turn(role="assistant", content=answer, token_ids=[4], logprobs=[-0.1])]
    trajectory.reward = reward
    trajectory.verdict = Verdict(reward=reward, status="pass" if reward else "fail", layers_run=["exact"],
                                 stopped_because="decided")
    trajectory.timings = {"generation": 0.01, "verification": 0.001, "total": 0.02}
    trajectory.costs = {"policy_seconds": 0.01, "total": 0.0}
    return trajectory


def _step_overhead(tasks, config: GRPOConfig, *, groups: int, steps: int) -> dict:
    """A step's work outside generation, verification and the update, as Pipeline.train_step, Pipeline._select and
    the training loop's record do it, timed around the engine's own functions (the trajectories are made
    beforehand, untimed: they are what generation and verification hand over)."""
    scheduler = Scheduler(tasks.domains, seed=config.seed, curriculum=Curriculum(),
                          category_quotas=config.category_quotas)
    draws = Draws(scheduler, tasks, batch=groups)
    counters = RunCounters()
    rng = random.Random(0)
    samples, points_written = [], []
    for step in range(steps):
        began = time.perf_counter()
        drawn = draws.new(groups)
        elapsed = time.perf_counter() - began
        made = [[_trajectory(task, sample, reward) for sample, reward in
                 enumerate(_solved(task.template.domain, task.item.key, step, rng))] for task in drawn]
        began = time.perf_counter()
        trained = []
        for task, group in zip(drawn, made, strict=True):
            scheduler.curriculum.observe(ScheduledTask(task.template.domain, task.template.key, task.item.key),
                                         [t.reward for t in group])
            if assign_advantages(group, normalize_std=config.normalize_std):
                trained.append(group)
        consumed = [t for group in made for t in group]
        for t in consumed:
            t.step = step + 1
        counters.active_seconds += 1.0
        points = step_points(counters=counters, consumed=consumed, trained=[t for g in trained for t in g],
                             stats=None, idle={"generation": 0.5}, step_seconds=1.0, groups=len(made),
                             effective_groups=len(trained), generation_tokens_per_second=100.0, staleness=[0])
        step_events(consumed)
        _kept = {"step": step + 1, "counters": counters.state(), "next_seq": draws.next_seq,  # the loop's state
                 "scheduler": scheduler.state()}
        samples.append((elapsed + time.perf_counter() - began) * 1000)
        points_written.append(len(points))
    return {"ms": _percentiles(samples), "points_per_step_max": max(points_written)}


def _timed_get(client: Client, url: str, repeats: int) -> dict:
    times, size = [], 0
    for _ in range(repeats):
        began = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - began) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}")
        size = len(response.content)
    return {"ms_first": round(times[0], 1), "ms_p50": round(statistics.median(times[1:] or times), 1),
            "bytes": size}


def _run_page(*, project, user, bundle, tasks, config: GRPOConfig, workload: Workload) -> dict:
    """A run written step by step as a worker writes it, then its page."""
    run = run_create(project=project, bundle=bundle, steps=workload.run_steps * 2, name="bench-domains", actor=user,
                     via="cli")
    attempt = run_claim(run_id=run.pk, stale_after=0)
    scheduler = Scheduler(tasks.domains, seed=0, category_quotas=config.category_quotas)
    draws = Draws(scheduler, tasks, batch=workload.run_groups)
    rng = random.Random(0)
    record_ms, last_points = [], {}
    for step in range(1, workload.run_steps + 1):
        drawn = draws.new(workload.run_groups)
        trajectories = []
        for task in drawn:
            trajectory = _trajectory(task, 0, float(rng.random() < 0.5), run_id=str(run.pk))
            trajectory.step, trajectory.effective = step, True
            trajectories.append(trajectory)
        points = synthetic_step_points(step=step, steps_total=run.steps_total, rng=rng,
                                       domains=sorted({t.domain for t in trajectories}))
        began = time.perf_counter()
        run_step_record(run_id=run.pk, attempt=attempt, step=step, wall_time=time.time(), points=points,
                        trajectories=trajectories)
        record_ms.append((time.perf_counter() - began) * 1000)
        last_points = points
    client = Client()
    client.force_login(user)
    kwargs = {"project": project.slug, "run_id": run.pk}
    per_domain = [n for n in last_points if n.startswith("reward/") and n not in ("reward/mean",
                                                                                   "reward/slope_per_hour")]
    return {"steps": workload.run_steps, "domain_points_per_step": len(per_domain),
            "record_step_ms": _percentiles(record_ms),
            "page": _timed_get(client, reverse("runs:run_detail", kwargs=kwargs), workload.page_repeats),
            "domains_endpoint": _timed_get(client, reverse("runs:run_domains", kwargs=kwargs),
                                           workload.page_repeats),
            "live_update_bytes": _live_update_bytes(run, last_points)}


def _live_update_bytes(run: Run, points: dict) -> int:
    """The size of the message a step sends to the run's open pages (apps/runs/live.py)."""
    from apps.runs import live

    message = live.step_message(run_id=run.pk, step=run.step, wall_time=time.time(), points=points, events=[])
    return len(json.dumps(message, default=str))


def _leaderboard(*, project, user, members: dict, repeats: int) -> dict:
    """The bundle as an eval suite, three evaluations of it scoring every domain (their trajectories written in
    bulk, as an evaluation's attempt leaves them), then the suite's page."""
    suite = version_publish(project=project, kind="bundle", slug="suite", author=user,
                            spec={**members, "evaluation": {"samples_per_task": 1}}).version
    key, parts = suite_key(suite)
    domains = [p.ref.slug for p in suite.lock.of_kind("domain")]
    rng = random.Random(0)
    finished = datetime(2024, 1, 1, tzinfo=UTC)
    for rank, label in enumerate(EVALUATIONS):
        run = Run.objects.create(project=project, name=f"eval {label}", kind=RunKind.EVALUATION, bundle=suite,
                                 config={}, config_hash=label, status=RunStatus.COMPLETED, steps_total=1, step=1,
                                 created_by=user)
        rows = []
        for seq, (domain, task) in enumerate((d, k) for d in domains for k in range(2)):
            reward = float(rng.random() < 0.8 - 0.2 * rank)
            rows.append(TrajectoryRow(
                id=uuid.uuid5(uuid.NAMESPACE_URL, f"{run.pk}/{seq}"), project_id=project.pk, run=run, seq=seq,
                sample=0, attempt=1, domain=domain, template=f"task_template/{domain}-t@1", task_key=f"t{task:03d}",
                task_hash=f"{domain}/{task}", image="sandbox_image/py-basic@1", verifier="verifier/numeric@1",
                policy_version=0, step=1, effective=True, status="ok", reward=reward,
                verdict_status="pass" if reward else "fail", deciding_layer="exact", started_at=finished,
                finished_at=finished + timedelta(seconds=seq)))
        TrajectoryRow.objects.bulk_create(rows, batch_size=2000)
        Evaluation.objects.create(project=project, suite=suite, key=key, key_parts=parts, run=run,
                                  kind=TargetKind.BASE, label=label, created_by=user)
    client = Client()
    client.force_login(user)
    return {"evaluations": len(EVALUATIONS),
            "page": _timed_get(client, reverse("evals:suite_head", kwargs={"project": project.slug,
                                                                            "slug": "suite"}), repeats)}
