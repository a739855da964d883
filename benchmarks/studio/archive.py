"""Archive figures: what the studio's write side takes, measured in one run — trajectory rows per second into the
database through the studio's own writer, artifact megabytes per second into an object store through fsspec, and
websocket messages per second fanned out through the channel layer to `subscribers` open run pages.
docs/SCALING.md turns these, with `bench sandbox` and `bench verify`, into a capacity model.

Trajectory rows: every step goes through `run_step_record`, as a trainer's step does — its metric points, its
trajectories (`trajectories_record`: one upsert of the batch), the run's step and heartbeat, one transaction,
then the broadcast after commit. Each trajectory is shaped like an agentic one: a 120-token prompt and four turns
(the prompt, an assistant turn calling a tool, the tool's result, the answer; 400 sampled tokens with their
logprobs) and a verdict of three components (format, unit tests, judge). Measured at each of `step_sizes`
(64 is the default run config: 8 groups of 8), once more at 64 with a rendered PNG artifact a trajectory (written
to the blob storage inside the step, as the 3D domain's are), and with `writers` processes writing at once
(several runs' workers; each a connection of its own).

Artifacts: objects written through fsspec — the local file system (`file://`) under the data directory, and S3
(s3fs against a moto server this bench starts) when both are installed. Small objects are a rendered PNG as the
mesh verifier makes one; large ones 1 MiB of random bytes. `synced` counts an os.sync() after the writes as well:
on disk, not only in the page cache.

Fan-out: the studio's ASGI app in a daphne process of its own (as deployed), `subscribers` websocket clients
(aiohttp, logged in as a project member, in this process) on one run's stream, and `messages` run.step messages
of the real shape (every metric point of a step) sent to the run's group through the channel layer. channels_redis
stores a broadcast once per server process (naming all its subscribers there) and drops one beyond that process
channel's capacity (100), so they go in windows of a quarter of it, at most two in flight: a window is sent once
every subscriber has the one before the last. The latency is therefore that of a saturated stream (a window
queued ahead), not of a quiet one (`bench ui` measures that). Figures: messages delivered per second, and the CPU
seconds the server process, these clients and Redis spent per thousand delivered.

Everything the bench writes (a project of its own, its runs, their trajectories, files) is removed at the end but
the project, kept for the next run (versions are immutable).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection

from apps.operations.synthetic import render_png, synthetic_step_points
from apps.runs.models import Run
from apps.runs.services import run_claim, run_create, run_step_record

from .archive_writer import agentic_trajectory, writer_process
from .ui import _bench_project, _percentile

MIB = 1024 * 1024


def run(*, steps: int = 20, step_sizes=(16, 64, 256), writers: int = 2, subscribers: int = 100,
        messages: int = 500, artifact_objects: int = 300, artifact_mb: int = 64, **_) -> dict:
    out: dict = {"database": connection.vendor, "cores": os.cpu_count(),
                 "channel_layer": settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1]}
    user, project, bundle = _bench_project("bench-archive")
    try:
        out["artifacts"] = artifact_writes(objects=artifact_objects, megabytes=artifact_mb)
        out["trajectories"] = trajectory_writes(project=project, bundle=bundle, user=user, steps=steps,
                                                step_sizes=tuple(step_sizes), writers=writers)
        out["fanout"] = fanout(project=project, bundle=bundle, user=user, subscribers=subscribers,
                               messages=messages)
    finally:
        for run in Run.objects.filter(project=project):
            # The artifact store keeps a run's files under DATA_DIR/artifacts/<run id>/ (apps/trajectories/artifacts.py)
            shutil.rmtree(Path(settings.DATA_DIR) / "artifacts" / str(run.pk), ignore_errors=True)
        Run.objects.filter(project=project).delete()  # their trajectories, metric points and events with them
    return out


# --- trajectories (built by archive_writer.agentic_trajectory) ------------------------------------------------------

def _claimed_run(*, project, bundle, user, name: str, steps: int):
    run = run_create(project=project, bundle=bundle, steps=steps + 1, name=name, actor=user, via="cli")
    return run, run_claim(run_id=run.pk, stale_after=0)


def _write_steps(run, attempt: int, *, step_size: int, steps: int, artifact: bytes | None, seed: int) -> dict:
    """Step 1 warms the connection and caches up, not timed; then `steps` steps. The trajectories are built before
    the clock starts: they come from the engine, the writer only stores them. Besides the time: the CPU this
    process (the writer) and its database backend spent a row, and the WAL a row wrote (what a replica replays)."""
    rng = random.Random(seed)
    batches = [[agentic_trajectory(run_id=str(run.pk), seq=step * step_size + i, step=step, rng=rng,
                                   artifact=artifact) for i in range(step_size)] for step in range(1, steps + 2)]
    points = [synthetic_step_points(step=step, steps_total=steps + 1, rng=rng) for step in range(1, steps + 2)]
    seconds, rows = [], step_size * steps
    for step, (batch, step_points) in enumerate(zip(batches, points, strict=True), start=1):
        if step == 2:
            backend, writer_cpu = _database_usage(), time.process_time()
        began = time.perf_counter()
        run_step_record(run_id=run.pk, attempt=attempt, step=step, wall_time=time.time(), points=step_points,
                        trajectories=batch)
        if step > 1:
            seconds.append(time.perf_counter() - began)
    writer_cpu, after = time.process_time() - writer_cpu, _database_usage()
    total = sum(seconds)
    figures = {"step_size": step_size, "steps": steps, "rows": rows, "rows_per_s": round(rows / total, 1),
               "step_p50_ms": _percentile([s * 1000 for s in seconds], 0.5),
               "step_p95_ms": _percentile([s * 1000 for s in seconds], 0.95),
               "writer_cpu_ms_per_row": round(1000 * writer_cpu / rows, 2)}
    if backend and after:
        if backend["cpu_s"] is not None and after["cpu_s"] is not None:
            figures["database_cpu_ms_per_row"] = round(1000 * (after["cpu_s"] - backend["cpu_s"]) / rows, 2)
        figures["wal_bytes_per_row"] = round((after["wal"] - backend["wal"]) / rows)
    return figures


def _database_usage() -> dict | None:
    """PostgreSQL: this connection's backend CPU seconds (when the server runs on this machine: /proc) and the
    WAL position."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid(), pg_current_wal_lsn() - '0/0'::pg_lsn")
        pid, wal = cursor.fetchone()
    cpu = None
    try:
        if connection.settings_dict["HOST"] in ("127.0.0.1", "localhost", "") and \
                Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"postgres"):
            cpu = _cpu_seconds(pid)
    except OSError:  # another machine's, or another container's, process
        pass
    return {"cpu_s": cpu, "wal": int(wal)}


def _table_bytes() -> int | None:
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size('trajectories_trajectory')")
        return cursor.fetchone()[0]


def trajectory_writes(*, project, bundle, user, steps: int, step_sizes: tuple[int, ...], writers: int) -> dict:
    steps = max(1, steps)
    sample = agentic_trajectory(run_id=str(uuid.UUID(int=0)), seq=0, step=1, rng=random.Random(0))
    tokens = [sample.prompt_ids, *([t.token_ids, t.logprobs] for t in sample.turns)]
    out: dict = {"turns": len(sample.turns), "verdict_components": len(sample.verdict.components),
                 "sampled_tokens": sample.completion_tokens,
                 "json_bytes_per_row": len(json.dumps(sample.to_json())),
                 "json_bytes_token_ids_and_logprobs": len(json.dumps(tokens))}
    before, written = _table_bytes(), 0
    single = []
    for index, size in enumerate(step_sizes):
        run, attempt = _claimed_run(project=project, bundle=bundle, user=user, name=f"bench-archive-{size}",
                                    steps=steps)
        single.append(_write_steps(run, attempt, step_size=size, steps=steps, artifact=None, seed=index))
        written += size * (steps + 1)
    out["one_writer"] = single
    after = _table_bytes()
    if before is not None:
        out["table_bytes_per_row"] = round((after - before) / written)  # heap, TOAST and indexes
    png = render_png()
    run, attempt = _claimed_run(project=project, bundle=bundle, user=user, name="bench-archive-png", steps=steps)
    out["one_writer_with_png"] = {**_write_steps(run, attempt, step_size=64, steps=steps, artifact=png, seed=99),
                                  "png_bytes": len(png)}
    if connection.vendor == "postgresql" and writers > 1:
        out["concurrent_writers"] = _concurrent_writes(project=project, bundle=bundle, user=user, steps=steps,
                                                       writers=writers)
    else:
        out["concurrent_writers"] = {"skipped": "needs PostgreSQL and --writers above 1"}
    return out


def _concurrent_writes(*, project, bundle, user, steps: int, writers: int) -> dict:
    claimed = [_claimed_run(project=project, bundle=bundle, user=user, name=f"bench-archive-writer-{i}",
                            steps=steps) for i in range(writers)]
    # Processes, not threads (one interpreter's lock would be measured, not the database), and spawned, not forked:
    # a fork of a process with threads (a test run's servers, s3fs's event loop) can inherit a held lock and hang.
    # Each opens its own connection to the caller's database.
    context = multiprocessing.get_context("spawn")
    ready, go, results = context.Queue(), context.Event(), context.Queue()
    database = {"NAME": connection.settings_dict["NAME"]}
    processes = [context.Process(target=writer_process,  # archive_writer.py: importable before Django is set up
                                 args=(database, run.pk, attempt, steps, 1000 + i, ready, go, results))
                 for i, (run, attempt) in enumerate(claimed)]
    for process in processes:
        process.start()
    for _ in processes:  # building the trajectories is not what is measured
        ready.get()
    began = time.perf_counter()
    go.set()
    collected = [results.get() for _ in processes]
    seconds = time.perf_counter() - began
    for process in processes:
        process.join()
    rows = sum(r for r, _, _ in collected)
    return {"writers": writers, "step_size": 64, "steps_each": steps, "rows": rows,
            "rows_per_s": round(rows / seconds, 1),
            "rows_per_s_each": [round(r / s, 1) for r, s, _ in collected if s],
            "errors": [error for _, _, error in collected if error][:5]}


# --- artifacts --------------------------------------------------------------------------------------------------

def artifact_writes(*, objects: int, megabytes: int) -> dict:
    png = render_png()
    noise = random.Random(5)
    small = [(f"t{i:05d}/views/iso.png", png) for i in range(objects)]
    large = [(f"t{i:05d}/mesh.bin", noise.randbytes(MIB)) for i in range(megabytes)]
    out: dict = {"small_object_bytes": len(png), "small_objects": objects, "large_object_bytes": MIB,
                 "large_objects": megabytes}
    root = Path(tempfile.mkdtemp(prefix="bench-archive-", dir=_ensure(Path(settings.DATA_DIR))))
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(f"file://{root}", auto_mkdir=True)  # keys, as in a bucket
        out["local"] = {"url": "file://<data dir>", "small": _put_all(fs, path, small, sync=True),
                        "large": _put_all(fs, path, large, sync=True)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["s3"] = _s3_writes(small, large)
    return out


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _put_all(fs, root: str, items: list[tuple[str, bytes]], *, sync: bool = False, batched: bool = False) -> dict:
    total = sum(len(data) for _, data in items)
    began = time.perf_counter()
    if batched:  # s3fs sends these at once (its batch size), as an uploader with a pool of connections would
        fs.pipe({f"{root}/{name}": data for name, data in items})
    else:
        for name, data in items:
            fs.pipe_file(f"{root}/{name}", data)
    seconds = time.perf_counter() - began
    figures = {"objects_per_s": round(len(items) / seconds, 1), "mb_per_s": round(total / MIB / seconds, 1)}
    if sync:
        os.sync()
        synced = time.perf_counter() - began
        figures.update(objects_per_s_synced=round(len(items) / synced, 1),
                       mb_per_s_synced=round(total / MIB / synced, 1))
    return figures


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_listening(port: int, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listened on port {port} within {timeout:.0f} s")


def _with_server(command: list[str], port: int, measure, *, log_chars: int = 2000, listen_seconds: float = 60.0,
                 **popen) -> dict:
    """`measure(server)` against a server process started with `command`, once it listens on `port` (within
    `listen_seconds`); a failure is reported in the figures with the tail of the server's log. The server is
    stopped either way."""
    log = tempfile.TemporaryFile()
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, **popen)
    try:
        _wait_listening(port, server, timeout=listen_seconds)
        return measure(server)
    except Exception as exc:  # noqa: BLE001 -- reported in the figures
        log.seek(0)
        return {"error": repr(exc), "server_log_tail": log.read()[-log_chars:].decode(errors="replace")}
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:  # the embedded studio's exit waits on its rollouts' executor threads
            server.kill()
            server.wait()
        log.close()


def _s3_writes(small, large) -> dict:
    if not (find_spec("s3fs") and find_spec("moto")):
        return {"skipped": "s3fs and moto are not installed in this environment: S3 was not measured"}
    import fsspec

    port = _free_port()

    def measure(_server) -> dict:
        fs = fsspec.filesystem("s3", key="bench", secret="bench", skip_instance_cache=True,
                               client_kwargs={"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "eu-west-1"})
        fs.mkdir("bench-archive")
        return {"url": "s3://bench-archive (moto server, in memory, on this machine)",
                "small": _put_all(fs, "bench-archive/one", small), "large": _put_all(fs, "bench-archive/one", large),
                "small_batched": _put_all(fs, "bench-archive/many", small, batched=True),
                "large_batched": _put_all(fs, "bench-archive/many", large, batched=True)}

    return _with_server([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port, measure)


# --- websocket fan-out ------------------------------------------------------------------------------------------

def _database_url() -> str:
    """The database this process uses (the test database under pytest), for the server process."""
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = quote(db["USER"] or "", safe="") + (f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else "")
        return f"postgres://{auth}@{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"
    return f"sqlite:///{db['NAME']}"


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _redis_cpu_seconds() -> float | None:
    import redis

    try:
        info = redis.Redis.from_url(settings.REDIS_URL).info("cpu")
    except redis.RedisError:
        return None
    return info["used_cpu_sys"] + info["used_cpu_user"]


def fanout(*, project, bundle, user, subscribers: int, messages: int) -> dict:
    from channels.layers import get_channel_layer
    from django.test import Client

    if subscribers < 1:
        return {"skipped": "no subscribers asked for"}
    layer = get_channel_layer()
    if not hasattr(layer, "capacity") or type(layer).__module__.split(".")[0] != "channels_redis":
        return {"skipped": "needs the Redis channel layer (REDIS_URL): with the in-memory one only a server in the "
                           "same process hears a broadcast"}
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        return {"skipped": "the server process cannot open an in-memory SQLite database"}
    run = run_create(project=project, bundle=bundle, steps=1, name="bench-archive-fanout", actor=user, via="cli")
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": _database_url(), "REDIS_URL": settings.REDIS_URL,
           "SECRET_KEY": settings.SECRET_KEY, "STUDIO_DATA_DIR": str(settings.DATA_DIR),
           "DJANGO_SETTINGS_MODULE": "studio.settings"}

    def measure(server) -> dict:
        points = synthetic_step_points(step=1, steps_total=100, rng=random.Random(0))
        window = max(1, layer.capacity // 4)
        redis_cpu = _redis_cpu_seconds()
        figures = asyncio.run(_fan_out(port=port, cookie=cookie, layer=layer, group=f"run-{run.pk}",
                                       run_id=str(run.pk), points=points, subscribers=subscribers,
                                       messages=messages, window=window, server_pid=server.pid))
        figures["server_cpu_s_per_1000"] = round(1000 * figures.pop("server_cpu_s") / max(1, figures["delivered"]), 3)
        if redis_cpu is not None and figures.get("redis_cpu_after") is not None:
            figures["redis_cpu_s_per_1000"] = round(
                1000 * (figures.pop("redis_cpu_after") - redis_cpu) / max(1, figures["delivered"]), 3)
        figures.pop("redis_cpu_after", None)
        return {"server": "daphne, one process", "subscribers": subscribers, "messages": messages,
                "window": window, "message_bytes": len(json.dumps(_step_message(run.pk, 0, points))), **figures}

    return _with_server([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "-v", "0",
                         "studio.asgi:application"], port, measure, log_chars=3000, cwd=settings.BASE_DIR, env=env)


def _step_message(run_id, seq: int, points: dict) -> dict:
    """A run.step message as apps/runs/live.py broadcasts it (wall_time: when it was sent)."""
    return {"type": "run.step", "run": str(run_id), "step": seq, "wall_time": time.time(), "points": points,
            "events": []}


async def _fan_out(*, port, cookie, layer, group, run_id, points, subscribers, messages, window,
                   server_pid) -> dict:
    import aiohttp
    import orjson

    last_seen = [0] * subscribers
    received = [0] * subscribers
    latencies: list[float] = []
    state = {"target": 0, "reached": 0, "measuring": False}
    reached = asyncio.Event()

    async def listen(index, ws):
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = orjson.loads(message.data)
            if data.get("type") != "run.step":
                continue
            seq = data["step"]
            if state["measuring"]:
                received[index] += 1
                latencies.append(time.time() - data["wall_time"])
            before, last_seen[index] = last_seen[index], seq
            if before < state["target"] <= seq:
                state["reached"] += 1
                if state["reached"] == subscribers:
                    reached.set()

    async def all_have(seq: int, timeout: float = 30.0) -> bool:
        state["target"], state["reached"] = seq, sum(1 for s in last_seen if s >= seq)
        reached.clear()
        if state["reached"] == subscribers:
            return True
        try:
            await asyncio.wait_for(reached.wait(), timeout)
            return True
        except TimeoutError:
            return False

    url = f"http://127.0.0.1:{port}/ws/runs/{run_id}/"
    headers = {"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        sockets = await asyncio.gather(*(session.ws_connect(url, headers=headers, heartbeat=None, max_msg_size=0)
                                         for _ in range(subscribers)))
        readers = [asyncio.create_task(listen(i, ws)) for i, ws in enumerate(sockets)]
        seq, stalls, send_s = 0, 0, 0.0
        for _ in range(window):  # warm-up: the consumers' first sends, not measured
            seq += 1
            await layer.group_send(group, _step_message(run_id, seq, points))
        stalls += not await all_have(seq)
        state["measuring"] = True
        first = seq + 1
        ends: list[int] = []
        server_cpu, clients_cpu = _cpu_seconds(server_pid), time.process_time()
        began = time.perf_counter()
        while seq < first - 1 + messages:
            if len(ends) >= 2:  # at most two windows in flight per channel
                stalls += not await all_have(ends[-2])
            for _ in range(min(window, first - 1 + messages - seq)):
                seq += 1
                sent = time.perf_counter()
                await layer.group_send(group, _step_message(run_id, seq, points))
                send_s += time.perf_counter() - sent
            ends.append(seq)
        stalls += not await all_have(seq)
        seconds = time.perf_counter() - began
        server_cpu, clients_cpu = _cpu_seconds(server_pid) - server_cpu, time.process_time() - clients_cpu
        redis_after = _redis_cpu_seconds()
        for ws in sockets:
            await ws.close()
        for reader in readers:
            reader.cancel()
    delivered = sum(received)
    expected = messages * subscribers
    return {"delivered": delivered, "lost": expected - delivered, "stalled_windows": stalls,
            "seconds": round(seconds, 2), "messages_per_s": round(delivered / seconds, 1),
            "broadcasts_per_s": round(messages / seconds, 1),
            "group_send_mean_ms": round(1000 * send_s / messages, 2),
            "latency_p50_ms": _percentile([x * 1000 for x in latencies], 0.5) if latencies else None,
            "latency_p95_ms": _percentile([x * 1000 for x in latencies], 0.95) if latencies else None,
            "clients_cpu_s_per_1000": round(1000 * clients_cpu / max(1, delivered), 3),
            "server_cpu_s": server_cpu, "redis_cpu_after": redis_after}
