"""What the environment server adds to a trainer elsewhere: episodes per second and tool-call (step) latency p50/p95
through OpenEnv's WebSocket (a real `manage.py environments serve` process, OpenEnv's own async client) against the
same episodes played in this process (workers/environments Episode, the same draws, runners and verifier), at each
number of concurrent sessions (there the difference is mostly the two sides' share of 2 cores); what one session's
step costs more through the WebSocket, the same cheap call in alternating blocks (`added_per_step`, the target's
measure); and OpenEnv's round trip alone (list_tools, which touches no sandbox).

The episodes are the demo's repository tasks (bundle demo-repositories: a sandbox session per episode, bash calls in
it, then submit, whose diff the hidden tests grade), the heaviest the demo has: the target is 64 concurrent sessions
on 2 cores without an error, and at most 2 ms added to a step's p50. Each side first plays one episode of every task
it will draw, so neither pays a workspace's preparation in what is measured.

Last, `never_closed` sessions (1,000 by default) that reset an episode and then neither speak nor close, on a server
of their own with a 2 s idle timeout, in waves of its 64-session bound: what the server still holds once the reaper
has freed them (descriptors, memory, busy sandboxes), how many clients it hung up on, how many episodes it recorded
as abandoned.

The demo is seeded (idempotent: an existing demo is left as it is) and committed, since the server is another
process; the bench's token is revoked and its runs deleted at the end.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.conf import settings
from django.core.management import call_command

from apps.accounts.models import ApiToken, Membership, Project, Role, TokenScope
from apps.accounts.services import api_token_create, api_token_revoke
from apps.environments.served import ServedBundle
from apps.runs.models import Run
from workers.environments.episode import Episode

ROOT = Path(__file__).resolve().parents[2]
BUNDLE, TEMPLATE = "demo-repositories", "repository-bugfix"
# Each call a new process in the session's workspace, as a coding agent's calls are: look, count, run Python.
COMMANDS = ("ls", "wc -l README* setup.py 2>/dev/null | tail -1", "python3 -c 'print(sum(range(10**5)))'",
            "grep -rl 'def ' --include=*.py . | head -3")


def run(*, sessions: list[int] | None = None, episodes: int = 2, calls: int = 4, never_closed: int = 1000,
        **_) -> dict:
    sessions = sessions or [1, 16, 64]
    call_command("seed_demo", stdout=io.StringIO())
    project = Project.objects.get(slug="demo")
    owner = Membership.objects.filter(project=project, role=Role.OWNER).select_related("user").first().user
    stamp = time.strftime("%Y%m%d-%H%M%S")
    token, plaintext = api_token_create(user=owner, name=f"bench-environments-{stamp}", project=project,
                                        scope=TokenScope.ENVIRONMENT, via="cli")
    port = _free_port()
    server, log = _start_server(port, max(sessions))
    try:
        url = f"http://bench:{plaintext}@127.0.0.1:{port}"
        served = ServedBundle.open(project=project, bundle=BUNDLE, sessions=max(sessions))
        try:
            seeds = _seeds(served, max(sessions) * episodes)
            asyncio.run(_warm_server(url, seeds, stamp))
            _warm_here(served, seeds)
            results = {}
            for count in sessions:
                plan = [seeds[(n * episodes + e) % len(seeds)] for n in range(count) for e in range(episodes)]
                websocket = asyncio.run(_over_websocket(url, count, plan, calls, f"bench-environments-{stamp}"))
                websocket["server_rss_mb"] = _rss_mb(server.pid)
                in_process = _in_process(served, count, plan, calls)
                results[str(count)] = {
                    "websocket": websocket, "in_process": in_process,
                    "added_p50_ms": round(websocket["step_p50_ms"] - in_process["step_p50_ms"], 2),
                    "added_p95_ms": round(websocket["step_p95_ms"] - in_process["step_p95_ms"], 2)}
            round_trip = asyncio.run(_round_trip(url, stamp))
            added = _added_per_step(url, served, seeds[0], f"bench-environments-{stamp}")
        finally:
            served.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    try:
        left = _never_closed(plaintext, seeds, never_closed, f"bench-environments-{stamp}-never-closed") \
            if never_closed else None
    finally:
        api_token_revoke(token=ApiToken.objects.get(pk=token.pk), actor=owner, via="cli")
        Run.objects.filter(project=project, name__startswith=f"bench-environments-{stamp}").delete()
    return {"bundle": BUNDLE, "template": TEMPLATE, "episodes_per_session": episodes, "calls_per_episode": calls,
            "sandbox_backend": settings.SANDBOX_BACKEND, "cpus": os.cpu_count(), "sessions": results,
            "added_per_step": added, "openenv_round_trip": round_trip, "never_closed": left, "server_log": str(log)}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_server(port: int, sessions: int, *, idle_timeout: float = 300.0, name: str = "server"):
    """The server in a process of its own, on this process's settings (its environment: the same database)."""
    log = Path(settings.DATA_DIR) / f"bench-environments-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "manage.py", "environments", "serve", "--bundle", BUNDLE, "--project", "demo", "--port",
         str(port), "--max-sessions", str(sessions), "--max-sessions-per-token", str(sessions), "--idle-timeout",
         str(idle_timeout)],
        cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the environment server exited with {process.returncode}: see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process, log
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the environment server did not answer within 120 s: see {log}")


def _seeds(served: ServedBundle, draws: int) -> list[int]:
    """Seeds whose draws cover the template's tasks, each task once (as many as there are, up to `draws`)."""
    found, seed = {}, 0
    tasks = len(served.tasks.items[next(k for k in served.tasks.items if f"/{TEMPLATE}@" in k)])
    while len(found) < min(tasks, draws) and seed < 10_000:
        key = served.task(seed=seed, template=TEMPLATE).item.key
        found.setdefault(key, seed)
        seed += 1
    return list(found.values())


def _percentiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0] * 1000, values[0] * 1000) if values else (0.0, 0.0)
    cuts = statistics.quantiles(values, n=20, method="inclusive")
    return statistics.median(values) * 1000, cuts[18] * 1000


def _summary(count: int, episodes: int, wall: float, steps: list[float], errors: list[str]) -> dict:
    p50, p95 = _percentiles(steps)
    return {"sessions": count, "episodes": episodes, "wall_seconds": round(wall, 2),
            "episodes_per_second": round(episodes / wall, 3) if wall else 0.0, "steps": len(steps),
            "step_p50_ms": round(p50, 2), "step_p95_ms": round(p95, 2), "errors": len(errors),
            "first_errors": errors[:3]}


async def _play(env, seed: int, calls: int, run: str, steps: list[float]) -> None:
    await env.reset(template=TEMPLATE, seed=seed, run=run, client="bench")
    for n in range(calls):
        started = time.perf_counter()
        await env.step({"type": "call_tool", "tool_name": "bash", "arguments": {"command": COMMANDS[n % 4]}})
        steps.append(time.perf_counter() - started)
    result = await env.step({"type": "call_tool", "tool_name": "submit", "arguments": {}})
    if not result.done:
        raise RuntimeError("submit did not end the episode")


async def _over_websocket(url: str, count: int, plan: list[int], calls: int, run: str) -> dict:
    from openenv.core.generic_client import GenericEnvClient

    steps, errors = [], []
    per_session = len(plan) // count

    async def session(index: int) -> None:
        try:
            async with GenericEnvClient(base_url=url, message_timeout_s=600) as env:
                for seed in plan[index * per_session:(index + 1) * per_session]:
                    await _play(env, seed, calls, run, steps)
        except Exception as exc:  # counted: the target is none
            errors.append(f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    await asyncio.gather(*(session(index) for index in range(count)))
    return _summary(count, len(plan), time.perf_counter() - started, steps, errors)


async def _warm_server(url: str, seeds: list[int], stamp: str) -> None:
    """One episode of every task on the server at once: each task's workspace prepared before anything is timed."""
    await _over_websocket(url, len(seeds), seeds, 1, f"bench-environments-{stamp}-warm")


def _warm_here(served: ServedBundle, seeds: list[int]) -> None:
    _in_process(served, len(seeds), seeds, 1)


def _in_process(served: ServedBundle, count: int, plan: list[int], calls: int) -> dict:
    steps, errors = [], []
    per_session = len(plan) // count

    def session(index: int) -> None:
        try:
            for seed in plan[index * per_session:(index + 1) * per_session]:
                episode = Episode(served.task(seed=seed, template=TEMPLATE), run_id=str(uuid.uuid4()),
                                  tool_runner=served.tool_runner, verifier=served.verifier, prices=served.prices)
                for n in range(calls):
                    started = time.perf_counter()
                    episode.call("bash", {"command": COMMANDS[n % 4]})
                    steps.append(time.perf_counter() - started)
                episode.call("submit", {})
                if not episode.done:
                    raise RuntimeError("submit did not end the episode")
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=count) as threads:
        list(threads.map(session, range(count)))
    return _summary(count, len(plan), time.perf_counter() - started, steps, errors)


def _added_per_step(url: str, served: ServedBundle, seed: int, run: str, *, blocks: int = 3,
                    calls: int = 30) -> dict:
    """The target's own measure: one session, the same cheap call (`true`) through the WebSocket and in-process, one
    after the other, so that the machine's drift falls on both sides alike; an episode per block (the template
    allows 40 calls), its first call, which opens the session, not counted."""
    from openenv.core.generic_client import GenericEnvClient

    sides = {"websocket": [], "in_process": []}
    call = {"type": "call_tool", "tool_name": "bash", "arguments": {"command": "true"}}

    async def alternate() -> None:
        async with GenericEnvClient(base_url=url) as env:
            for _ in range(blocks):
                await env.reset(template=TEMPLATE, seed=seed, run=run, client="bench")
                episode = Episode(served.task(seed=seed, template=TEMPLATE), run_id=str(uuid.uuid4()),
                                  tool_runner=served.tool_runner, verifier=served.verifier, prices=served.prices)
                for n in range(calls + 1):
                    started = time.perf_counter()
                    await env.step(call)
                    between = time.perf_counter()
                    episode.call("bash", call["arguments"])
                    if n:
                        sides["websocket"].append(between - started)
                        sides["in_process"].append(time.perf_counter() - between)
                episode.abandon("the bench moved on")

    asyncio.run(alternate())
    figures = {side: dict(zip(("p50_ms", "p95_ms"), (round(v, 2) for v in _percentiles(times)), strict=True))
               for side, times in sides.items()}
    return {**figures, "samples": len(sides["websocket"]),
            "added_p50_ms": round(figures["websocket"]["p50_ms"] - figures["in_process"]["p50_ms"], 2)}


async def _round_trip(url: str, stamp: str, samples: int = 200) -> dict:
    """OpenEnv's protocol alone: list_tools answered from the episode, no sandbox."""
    from openenv.core.generic_client import GenericEnvClient

    times = []
    async with GenericEnvClient(base_url=url) as env:
        await env.reset(template=TEMPLATE, seed=0, run=f"bench-environments-{stamp}", client="bench")
        for _ in range(samples):
            started = time.perf_counter()
            await env.step({"type": "list_tools"})
            times.append(time.perf_counter() - started)
    p50, p95 = _percentiles(times)
    return {"samples": samples, "p50_ms": round(p50, 3), "p95_ms": round(p95, 3)}


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


def _never_closed(plaintext: str, seeds: list[int], total: int, run: str, *, wave: int = 64,
                  idle: float = 2.0) -> dict:
    """`total` sessions that reset an episode and then never speak again nor close, in waves of the server's bound
    (a server of their own: `wave` sessions, `idle` seconds to the reaper): what the server holds once the idle
    timeout has freed them (its descriptors, memory and busy sandboxes against before the first wave), whether each
    client was hung up on, and each episode recorded as abandoned. A wave's client refused because the last wave's
    places were not free yet is counted and tried again in the next."""
    from openenv.core.generic_client import GenericEnvClient

    from apps.trajectories.models import Trajectory

    port = _free_port()
    server, log = _start_server(port, wave, idle_timeout=idle, name="never-closed")
    url = f"http://bench:{plaintext}@127.0.0.1:{port}"
    before = {"fds": _fds(server.pid), "rss_mb": _rss_mb(server.pid)}
    held, refusals = [], 0

    async def one(seed: int):
        env = GenericEnvClient(base_url=url, message_timeout_s=600)
        await env.reset(template=TEMPLATE, seed=seed, run=run, client="bench")
        return env

    async def waves() -> None:
        nonlocal refusals
        while len(held) < total:
            batch = [seeds[(len(held) + n) % len(seeds)] for n in range(min(wave, total - len(held)))]
            for answer in await asyncio.gather(*(one(seed) for seed in batch), return_exceptions=True):
                if isinstance(answer, BaseException):
                    refusals += 1
                else:
                    held.append(answer)
            await asyncio.sleep(idle * 1.5)  # nobody calls: the reaper (every idle / 4) frees the wave

    async def closing() -> None:
        for env in held:
            await env.close()

    started = time.perf_counter()
    try:
        asyncio.run(waves())
        seconds = time.perf_counter() - started
        time.sleep(idle)
        hung_up = sum(1 for env in held if env._ws is not None and env._ws.close_code == 1001)
        after = {"fds": _fds(server.pid), "rss_mb": _rss_mb(server.pid),
                 "sandboxes_busy": _busy_sandboxes(server.pid)}
        asyncio.run(closing())
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    abandoned = Trajectory.objects.filter(run__name=run, status="abandoned").count()
    return {"sessions": total, "opened": len(held), "seconds": round(seconds, 1), "capacity_refusals": refusals,
            "hung_up": hung_up, "abandoned_recorded": abandoned, "server_before": before, "server_after": after,
            "server_log": str(log)}


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def _busy_sandboxes(pid: int) -> int:
    """Sandboxes the server's pool holds (its status files, published every second)."""
    import json

    files = (Path(settings.DATA_DIR) / "sandbox-pools").glob(f"pool-{pid}-*.json")
    return sum(image["busy"] for path in files for image in json.loads(path.read_text())["images"])
