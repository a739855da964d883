"""Live studio figures: metric write → visible in a browser (p50/p95, several runs streaming at once), and the
trajectory list's server time with a million trajectories (PostgreSQL).

Push latency: the studio's ASGI app runs in a thread of this process (daphne; with REDIS_URL the Redis channel
layer carries the broadcasts, otherwise the in-memory one, as in the embedded studio). Chromium opens one run
page per streaming run; worker threads write steps through run_step_record, each noting the time just before
its write; each page notes when the step's points were drawn (after Plotly finished). Latency = drawn - written.

Trajectory list: trajectories are generated with COPY inside a transaction that is rolled back at the end, and
the list view is timed through Django's full request handling (test client: middleware, view, template).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client

from apps.accounts.models import Project
from apps.accounts.services import project_create
from apps.registry.services import version_publish

CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1280, "height": 900}  # a laptop screen: the run page shows four charts above the fold
SPECS = [
    ("sandbox_image", "img", {"layers": [{"type": "base", "image": "python-3.11"}]}),
    ("verifier", "ver", {"layers": [{"name": "exact", "kind": "exact", "checks": [{"type": "numeric"}]}]}),
    ("task_template", "t", {"prompt_template": "{a}+{b}=", "sandbox_image": "img", "verifier": "ver"}),
    ("domain", "arithmetic", {"templates": [{"template": "t", "weight": 1.0}]}),
    ("bundle", "b", {"members": ["domain/arithmetic@latest"]}),
]


class _Rollback(Exception):
    pass


def _percentile(values, q):
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))], 1)


def _bench_project(slug: str):
    """A project of its own with a one-domain bundle; the same one again on a later run (versions are immutable
    and cannot be deleted, so the push benchmark keeps its small project and removes only its runs)."""
    user = get_user_model().objects.filter(username=slug).first() or get_user_model().objects.create_user(slug)
    project = Project.objects.filter(slug=slug).first() or project_create(team_slug="bench", slug=slug, name=slug,
                                                                          owner=user, via="cli")
    bundle = None
    for kind, name, spec in SPECS:  # publishing an identical spec returns the existing version
        bundle = version_publish(project=project, kind=kind, slug=name, spec=spec, author=user, via="cli").version
    return user, project, bundle


def run(*, trajectories: int = 1_000_000, streams: int = 10, stream_steps: int = 30, warmup_steps: int = 5,
        step_seconds: float = 1.0, skip_push: bool = False, skip_list: bool = False, **_) -> dict:
    result: dict = {"database": connection.vendor,
                    "channel_layer": settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1]}
    if not skip_push:
        result["push"] = push_latency(streams=streams, steps=stream_steps, warmup=warmup_steps,
                                      step_seconds=step_seconds)
    if not skip_list:
        if connection.vendor != "postgresql":
            result["trajectory_list"] = {"skipped": "needs PostgreSQL: set DATABASE_URL=postgres://..."}
        else:
            result["trajectory_list"] = trajectory_list_times(trajectories=trajectories)
    return result


# --- push latency -----------------------------------------------------------------------------------------------

def push_latency(*, streams: int, steps: int, warmup: int, step_seconds: float) -> dict:
    """Each run writes `warmup` steps, then `steps` measured ones. The warm-up steps are not counted: ten renderer
    processes that have just loaded a page compile Plotly's code paths on their first redraws (their first steps
    took 0.4-2 s here, the same pages' later steps ~0.1 s)."""
    first, last = warmup + 2, warmup + steps + 1  # step 1 is history, already on the pages when streaming starts
    from apps.operations.synthetic import synthetic_step_points, synthetic_trajectories
    from apps.runs.models import Run
    from apps.runs.services import run_claim, run_step_record

    if not os.path.exists(CHROMIUM):
        return {"skipped": f"needs Chromium at {CHROMIUM} (apt-get install chromium)"}
    from playwright.sync_api import sync_playwright

    from benchmarks.studio.asgi_thread import ThreadedServer

    user, project, bundle = _bench_project("bench-ui-push")
    try:
        from apps.runs.services import run_create

        runs = [run_create(project=project, bundle=bundle, steps=last + 1, name=f"stream-{i}", actor=user, via="cli")
                for i in range(streams)]
        attempts = {r.pk: run_claim(run_id=r.pk, stale_after=0) for r in runs}
        warm = random.Random(1)
        for r in runs:  # the runs are already under way: their pages open on a step of history
            run_step_record(run_id=r.pk, attempt=attempts[r.pk], step=1, wall_time=time.time(), trajectories=[],
                            points=synthetic_step_points(step=1, steps_total=steps, rng=warm))
        client = Client()
        client.force_login(user)
        cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
        server = ThreadedServer()
        base = server.start()
        written: dict[tuple[str, int], float] = {}
        errors: list[str] = []

        def stream(run, seed):
            from django.db import close_old_connections

            rng = random.Random(seed)
            time.sleep(rng.random() * step_seconds)  # the runs do not step in lockstep
            try:
                for step in range(2, last + 1):
                    started = time.time()
                    points = synthetic_step_points(step=step, steps_total=steps, rng=rng)
                    rows = synthetic_trajectories(run=run, step=step, rng=rng, per_step=2)
                    written[(str(run.pk), step)] = time.time()
                    run_step_record(run_id=run.pk, attempt=attempts[run.pk], step=step, wall_time=time.time(),
                                    points=points, trajectories=rows)
                    time.sleep(max(0.0, step_seconds - (time.time() - started)))
            except Exception as exc:  # reported, not raised: the other streams go on
                errors.append(f"{run.name}: {exc}")
            finally:
                close_old_connections()

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
                "--disable-backgrounding-occluded-windows"])
            pages = []
            for run in runs:  # one context (window) a page, so none is a throttled background tab
                context = browser.new_context(viewport=VIEWPORT)
                context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": base}])
                page = context.new_page()
                page.goto(f"{base}/p/{project.slug}/runs/{run.pk}/")
                pages.append((run, page))
            for _, page in pages:
                page.wait_for_function("window.studioLive && window.studioLive.connected && "
                                       "document.getElementById('run-live').dataset.lastStep === '1'", timeout=20_000)
            threads = [threading.Thread(target=stream, args=(run, i)) for i, run in enumerate(runs)]
            started = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for _, page in pages:
                page.wait_for_function(f"window.studioLive.rendered.some(r => r.step === {last})", timeout=20_000)
            seconds = time.monotonic() - started
            latencies, missing, render_ms, panels_drawn, arrivals = [], 0, [], [], []
            for run, page in pages:
                for r in page.evaluate("window.studioLive.received"):
                    if r["step"] >= first and (str(run.pk), r["step"]) in written:
                        arrivals.append(r["at"] - written[(str(run.pk), r["step"])] * 1000)
                rendered = [r for r in page.evaluate("window.studioLive.rendered") if r["step"] >= first]
                render_ms += [r["ms"] for r in rendered]
                panels_drawn += [r["panels"] for r in rendered]
                drawn = {r["step"]: r["at"] / 1000 for r in rendered}
                for step in range(first, last + 1):
                    if step in drawn and (str(run.pk), step) in written:
                        latencies.append((drawn[step] - written[(str(run.pk), step)]) * 1000)
                    else:
                        missing += 1
            browser.close()
        server.stop()
        points_per_step = len(synthetic_step_points(step=1, steps_total=steps, rng=random.Random(0)))
        return {"runs_streaming": streams, "steps_per_run": steps, "warmup_steps_per_run": warmup,
                "step_seconds": step_seconds, "viewport": f"{VIEWPORT['width']}x{VIEWPORT['height']}",
                "points_per_step": points_per_step, "trajectories_per_step": 2, "samples": len(latencies),
                "missing": missing, "errors": errors, "p50_ms": _percentile(latencies, 0.5),
                "p95_ms": _percentile(latencies, 0.95), "max_ms": round(max(latencies), 1) if latencies else None,
                "steps_per_second_all_runs": round(streams * (last - 1) / seconds, 1),
                "received_p50_ms": _percentile(arrivals, 0.5) if arrivals else None,
                "received_p95_ms": _percentile(arrivals, 0.95) if arrivals else None,
                "browser_draw_p50_ms": _percentile(render_ms, 0.5) if render_ms else None,
                "charts_redrawn_per_step_p50": statistics.median(panels_drawn) if panels_drawn else None}
    finally:
        Run.objects.filter(project=project).delete()  # its metric points, events and trajectories with it


# --- the trajectory list at a million rows -------------------------------------------------------------------

COPY_COLUMNS = ("id", "project_id", "run_id", "seq", "sample", "attempt", "domain", "template", "task_key",
                "task_hash", "image", "verifier", "policy_version", "step", "effective", "advantage", "status",
                "status_reason", "reward", "verdict_status", "deciding_layer", "num_turns", "num_tool_calls",
                "completion_tokens", "duration_s", "cost", "prompt_ids", "turns", "verdict", "timings", "costs",
                "artifacts", "started_at", "finished_at")
DOMAINS = [("arithmetic", "task_template/add-two@1"), ("python-coding", "task_template/python-functions@2"),
           ("3d-modelling", "task_template/primitive-solids@1"), ("document-qa", "task_template/cite-figures@1")]


def _copy_trajectories(*, project, runs, total: int) -> float:
    rng = random.Random(7)
    per_run = total // len(runs)
    turns = json.dumps([{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4",
                                                              "token_ids": [20], "logprobs": [-0.1]}])
    verdict = json.dumps({"reward": 1.0, "status": "pass", "layers_run": ["exact"], "components": []})
    timings, costs = json.dumps({"total": 1.0}), json.dumps({"total": 0.001})
    start = datetime(2026, 1, 1, tzinfo=UTC)
    began = time.perf_counter()
    with connection.cursor() as cursor:
        raw = cursor.cursor  # psycopg's own cursor: COPY, not INSERT
        with raw.copy(f"COPY trajectories_trajectory ({', '.join(COPY_COLUMNS)}) FROM STDIN") as copy:
            for index, run in enumerate(runs):
                run_start = start + timedelta(days=index)
                for seq in range(per_run):
                    domain, template = DOMAINS[seq % len(DOMAINS)]
                    roll = rng.random()
                    status = "ok" if roll < 0.97 else "timeout" if roll < 0.99 else "policy_error" if roll < 0.999 \
                        else "infra_error"
                    reward = None if status == "infra_error" else round(rng.random(), 3)
                    finished = run_start + timedelta(seconds=seq * 0.08)
                    copy.write_row((uuid.uuid4(), project.pk, run.pk, seq, 0, 1, domain, template,
                                    f"task-{seq % 5000:05d}", "0" * 64, "sandbox_image/python-3-11@1",
                                    "verifier/numeric@1", seq // 512, seq // 512, reward is not None and reward > 0.1,
                                    0.0, status, "", reward, "pass" if reward and reward > 0.5 else "fail", "exact", 1,
                                    seq % 3, 1 + seq % 40, rng.random() * 5, rng.random() / 100, "[]", turns,
                                    verdict, timings, costs, "[]", finished - timedelta(seconds=1), finished))
        cursor.execute("ANALYZE trajectories_trajectory")
    return time.perf_counter() - began


def trajectory_list_times(*, trajectories: int, repeats: int = 7) -> dict:
    """Each page's server time (p50 and max of `repeats` requests) and its query's plan (page_plan)."""
    from urllib.parse import urlencode

    from apps.runs.models import Run
    from apps.trajectories.models import Trajectory
    from apps.trajectories.selectors import cursor_encode

    out: dict = {"trajectories": trajectories}
    try:
        with transaction.atomic():
            user, project, bundle = _bench_project("bench-ui-list")
            runs = [Run.objects.create(project=project, name=f"bench-{i}", bundle=bundle, config={}, config_hash="0",
                                       steps_total=1000) for i in range(10)]
            out["generate_s"] = round(_copy_trajectories(project=project, runs=runs, total=trajectories), 1)
            client = Client()
            client.force_login(user)
            base = f"/p/{project.slug}/trajectories/"
            deep = Trajectory.objects.filter(project=project).order_by("-finished_at", "id") \
                .values_list("finished_at", "id")[trajectories // 2]
            deep_reward = Trajectory.objects.filter(project=project, reward__isnull=False) \
                .order_by("-reward", "-id").values_list("reward", "id")[trajectories // 2]
            run_deep = Trajectory.objects.filter(run=runs[3]).order_by("-finished_at", "id") \
                .values_list("finished_at", "id")[trajectories // 40]
            pages = {
                "first_page": {},
                "page_at_row_500000": {"after": cursor_encode(*deep)},
                "one_run": {"run": str(runs[3].pk)},
                "one_run_deep": {"run": str(runs[3].pk), "after": cursor_encode(*run_deep)},
                "one_domain": {"domain": "python-coding"},
                "rare_status_infra_error": {"status": "infra_error"},
                "timeouts_of_one_run": {"status": "timeout", "run": str(runs[5].pk)},
                "reward_high": {"sort": "reward_high"},
                "reward_high_deep": {"sort": "reward_high", "after": cursor_encode(*deep_reward)},
                "reward_high_of_one_run": {"sort": "reward_high", "run": str(runs[3].pk)},
                "slowest": {"sort": "slowest"},
                "one_task": {"task_key": "task-01234"},
                "template_any_version": {"template": "task_template/python-functions"},
            }
            times = {}
            for name, query in pages.items():
                samples = []
                for _ in range(repeats):
                    began = time.perf_counter()
                    response = client.get(base + (f"?{urlencode(query)}" if query else ""))
                    samples.append((time.perf_counter() - began) * 1000)
                    assert response.status_code == 200, (name, response.status_code)
                times[name] = {"p50_ms": round(statistics.median(samples), 1), "max_ms": round(max(samples), 1),
                               "rows": response.content.count(b"data-trajectory="),
                               "plan": page_plan(project=project, query=query)}
            out["pages"] = times
            out["worst_p50_ms"] = max(t["p50_ms"] for t in times.values())
            raise _Rollback
    except _Rollback:
        pass
    return out


def page_plan(*, project, query: dict) -> dict:
    """How PostgreSQL answered a page of the list (EXPLAIN ANALYZE of the selector's query): the indexes it walked
    and the trajectories it read to find the page's rows (those its filters threw away included). A page that
    reads far more rows than it shows walks the wrong index: the one-run first page walked along the project's
    newest-first index reads every newer run's rows before its own (294 ms at 200,000 rows, where the run's own
    index reads its 51)."""
    from apps.trajectories.selectors import trajectory_page_rows

    filters = {k: v for k, v in query.items() if k not in ("sort", "after")}
    rows = trajectory_page_rows(project=project, filters=filters, sort=query.get("sort", "recent"),
                                after=query.get("after", ""))
    indexes, read = [], 0
    nodes = [(json.loads(rows.explain(format="json", analyze=True))[0]["Plan"], False)]
    while nodes:  # (node, whether it is part of a bitmap scan of the archive's table)
        node, of_archive = nodes.pop()
        archive = of_archive or node.get("Relation Name") == "trajectories_trajectory"
        nodes += [(child, archive and node["Node Type"].startswith("Bitmap")) for child in node.get("Plans", [])]
        if archive and "Index Name" in node:
            indexes.append(node["Index Name"])
        elif archive and node["Node Type"] == "Seq Scan":
            indexes.append("sequential scan")
        if node.get("Relation Name") == "trajectories_trajectory":
            read += (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
    return {"indexes": sorted(indexes), "rows_read": read}
