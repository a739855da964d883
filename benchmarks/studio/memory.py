"""Memory of the embedded studio (`make demo`): the web process's resident memory while it trains the demo run
and its pages are requested.

The studio is set up as `make demo` sets it up, in a data directory of its own (temporary, SQLite, removed at the
end): migrate, seed_demo, the base model's evaluation on the demo suite queued (the evaluation lane), the demo run
queued with `steps` steps, its base model pretrained first (`train --prepare`), then `runserver --noreload` with
STUDIO_EMBEDDED_TRAINING=1, whose process trains the run and evaluates. While it trains, logged in as the demo
user, the explorer (its page and the callback that draws its figures) and the run's page (and its history) are
requested every `page_seconds`; every `sample_seconds` the process's resident memory is read from /proc, with
the run's step from the API.

Figures: the peak resident memory, and its growth per 100 steps after the first `warmup_steps` steps: the slope
of the least-squares line through the samples taken after the warm-up, per 100 steps, as a percentage of the
resident memory at the warm-up's end.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
from django.conf import settings

from apps.demo.seed import PASSWORD, PROJECT, USERNAME

from .archive import _free_port, _with_server

BUNDLE, RUN_NAME = "demo", "bench-memory"
TARGETS = {"peak_rss_mb": 3072, "growth_per_100_steps_percent": 5}
# What would make the studio something else than the embedded one `make demo` runs: services, another database,
# an object store, remote rollouts; DEBUG keeps every request's queries.
NOT_EMBEDDED = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "STUDIO_STORAGE_URL",
                "STUDIO_REMOTE_ROLLOUTS", "STUDIO_DATA_DIR", "DEBUG")
ENDED = ("completed", "failed", "cancelled", "paused")


def run(*, steps: int = 200, warmup_steps: int = 50, page_seconds: float = 20.0, sample_seconds: float = 5.0,
        max_minutes: float = 180.0, **_) -> dict:
    settings_used = {"steps": steps, "warmup_steps": warmup_steps, "page_seconds": page_seconds,
                     "sample_seconds": sample_seconds, "max_minutes": max_minutes, "bundle": BUNDLE,
                     "database": "sqlite (a data directory of its own)", "server": "runserver --noreload",
                     "cores": os.cpu_count(), "pretrain_seconds": settings.DEMO_PRETRAIN_SECONDS}
    data_dir = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    env = {key: value for key, value in os.environ.items() if key not in NOT_EMBEDDED}
    env.update({"STUDIO_DATA_DIR": str(data_dir), "SECRET_KEY": settings.SECRET_KEY,
                "DJANGO_SETTINGS_MODULE": "studio.settings"})
    try:
        began = time.monotonic()
        problem = _set_up(env, steps)
        if problem:
            return {"settings": settings_used, **problem}
        setup_s = time.monotonic() - began
        port = _free_port()
        command = [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"]
        figures = _with_server(command, port, lambda server: _measure(
            server, base=f"http://127.0.0.1:{port}", steps=steps, warmup_steps=warmup_steps,
            page_seconds=page_seconds, sample_seconds=sample_seconds, max_seconds=max_minutes * 60),
            cwd=settings.BASE_DIR, env={**env, "STUDIO_EMBEDDED_TRAINING": "1"}, listen_seconds=300)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return {"settings": settings_used, "setup_s": round(setup_s, 1), **figures}


def _set_up(env: dict, steps: int) -> dict | None:
    """`make demo`'s steps before the server, in the bench's data directory; a failure is returned as figures."""
    for args in (["migrate", "--noinput"], ["seed_demo"],
                 ["evaluate", "--suite", "demo-suite", "--model", "model/demo-tiny", "--if-absent"],
                 ["train", "--bundle", BUNDLE, "--steps", str(steps), "--name", RUN_NAME, "--prepare"]):
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=settings.BASE_DIR, env=env,
                              capture_output=True, text=True)
        if done.returncode != 0:
            return {"error": f"manage.py {' '.join(args)} exited with {done.returncode}",
                    "log_tail": (done.stdout + done.stderr)[-2000:]}
    return None


def _measure(server, *, base: str, steps: int, warmup_steps: int, page_seconds: float, sample_seconds: float,
             max_seconds: float) -> dict:
    browser = _logged_in(base)
    runs = browser.get(f"{base}/api/v1/projects/{PROJECT}/runs", timeout=60).json()
    run_id = next(r["id"] for r in runs if r["name"] == RUN_NAME)
    run_api = f"{base}/api/v1/projects/{PROJECT}/runs/{run_id}"
    pages = Pages(browser, base=base, run_id=run_id)
    samples: list[dict] = []
    began = time.monotonic()
    next_pages = began
    run = browser.get(run_api, timeout=60).json()
    while run["step"] < steps and run["status"] not in ENDED and time.monotonic() - began < max_seconds:
        if time.monotonic() >= next_pages:
            pages.request_all()
            next_pages = time.monotonic() + page_seconds
        run = browser.get(run_api, timeout=60).json()
        samples.append({"seconds": round(time.monotonic() - began, 1), "step": run["step"], **_memory(server.pid)})
        time.sleep(sample_seconds)
    peak = max(samples, key=lambda s: s["rss_mb"]) if samples else None
    after_warmup = growth(samples, warmup_steps=warmup_steps)
    rate = after_warmup["growth_per_100_steps_percent"]
    return {"run": {"status": run["status"], "step": run["step"], "error": run["error"][-500:]},
            "completed": run["step"] >= steps, "seconds": round(time.monotonic() - began, 1),
            "peak_rss_mb": peak and peak["rss_mb"], "peak_at_step": peak and peak["step"], **after_warmup,
            "pages": pages.figures(), "targets": TARGETS,
            "meets_targets": peak is not None and peak["rss_mb"] < TARGETS["peak_rss_mb"] and rate is not None
            and rate < TARGETS["growth_per_100_steps_percent"], "samples": samples}


def _logged_in(base: str) -> requests.Session:
    browser = requests.Session()
    browser.get(f"{base}/accounts/login/", timeout=60).raise_for_status()
    answer = browser.post(f"{base}/accounts/login/", timeout=60, allow_redirects=False, data={
        "username": USERNAME, "password": PASSWORD, "csrfmiddlewaretoken": browser.cookies["csrftoken"]})
    if answer.status_code != 302:
        raise RuntimeError(f"logging in as {USERNAME} answered {answer.status_code}")
    return browser


class Pages:
    """The pages a person watching the demo keeps open: the explorer (page and figures) and the run's page (and
    the history it fetches), requested as a browser would; statuses other than 200 are counted and kept."""

    def __init__(self, browser: requests.Session, *, base: str, run_id: str):
        self.browser, self.base, self.run_id = browser, base, run_id
        self.rounds, self.requests, self.errors, self.seconds = 0, 0, [], []
        self._figures_callback: dict | None = None

    def request_all(self) -> None:
        explore, run_page = f"{self.base}/p/{PROJECT}/explore/", f"{self.base}/p/{PROJECT}/runs/{self.run_id}/"
        began = time.monotonic()
        self._get(explore)
        if self._figures_callback is None:
            self._figures_callback = self._explorer_figures_callback(explore)
        self._check(explore + "_dash-update-component", self.browser.post(
            explore + "_dash-update-component", json=self._figures_callback, timeout=300,
            headers={"X-CSRFToken": self.browser.cookies.get("csrftoken", "")}))
        self._get(run_page)
        self._get(run_page + "history.json")
        self.rounds += 1
        self.seconds.append(time.monotonic() - began)

    def _explorer_figures_callback(self, explore: str) -> dict:
        """The request the explorer's page sends for its figures (every filter empty)."""
        dependencies = self._get(explore + "_dash-dependencies").json()
        callback = max(dependencies, key=lambda d: d["output"].count("..."))
        outputs = [dict(zip(("id", "property"), part.rsplit(".", 1), strict=True))
                   for part in callback["output"].strip(".").split("...")]
        return {"output": callback["output"], "outputs": outputs, "changedPropIds": [], "state": [],
                "inputs": [{"id": i["id"], "property": i["property"], "value": None} for i in callback["inputs"]]}

    def _get(self, url: str) -> requests.Response:
        return self._check(url, self.browser.get(url, timeout=300))

    def _check(self, url: str, response: requests.Response) -> requests.Response:
        self.requests += 1
        if response.status_code != 200:
            self.errors.append(f"{response.status_code} {url.removeprefix(self.base)}")
        return response

    def figures(self) -> dict:
        return {"rounds": self.rounds, "requests": self.requests, "errors": self.errors[:10],
                "round_p50_s": round(statistics.median(self.seconds), 2) if self.seconds else None}


def _memory(pid: int) -> dict:
    """Resident memory (all of it, and the anonymous part) and threads of a process, from /proc, with the anonymous
    part by where it lives (anonymous_by_mapping)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {"rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
            "anon_mb": round(int(fields["RssAnon"].split()[0]) / 1024, 1), "threads": int(fields["Threads"]),
            "anon_by_mapping_mb": anonymous_by_mapping(Path(f"/proc/{pid}/smaps").read_text())}


# glibc gives each thread arena heaps of HEAP_MAX_SIZE (64 MiB on 64-bit), aligned to that size: how its arenas are
# told apart from other anonymous mappings in /proc/PID/smaps.
ARENA_ALIGNMENT = 64 << 20


def anonymous_by_mapping(smaps: str) -> dict:
    """A process's anonymous resident memory (MB) by mapping: `main_heap` (glibc's main arena, [heap]),
    `thread_arenas` (the other threads' malloc arenas), `large_mmaps` (other anonymous mappings: allocations over
    malloc's mmap threshold, such as tensors and arrays, and thread stacks) and `other` (stacks of the main thread,
    file-backed mappings' private copies)."""
    totals = {"main_heap": 0, "thread_arenas": 0, "large_mmaps": 0, "other": 0}
    kind = "other"
    for line in smaps.splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:  # a mapping's header: range perms offset dev inode
            start = int(head[0].split("-")[0], 16)
            path = head[5].strip() if len(head) == 6 else ""
            kind = ("main_heap" if path == "[heap]" else "other" if path else
                    "thread_arenas" if start % ARENA_ALIGNMENT == 0 else "large_mmaps")
        elif line.startswith("Anonymous:"):
            totals[kind] += int(line.split()[1])
    return {name: round(kb / 1024, 1) for name, kb in totals.items()}


def growth(samples: list[dict], *, warmup_steps: int, window_steps: int = 10) -> dict:
    """The resident memory at the warm-up's end and its growth per 100 steps after it, in percent of the first
    sample after the warm-up: the least-squares slope through the floor of each `window_steps`-step window (its
    lowest sample), what the process keeps from one window to the next. A sample taken while the engine generates
    or a page is drawn also holds that moment's working set (up to 300 MB more in large mappings, read in
    anon_by_mapping_mb), which the peak reports and which is freed again; `growth_all_samples_per_100_steps_percent`
    is the slope through every sample, transients included. Only windows the run went past count: the last one
    may hold a single sample (the run's end, where its evaluation generates). None with fewer than two windows."""
    after = [s for s in samples if s["step"] >= warmup_steps]
    last_window = max((s["step"] for s in after), default=0) // window_steps
    floors: dict[int, float] = {}
    for sample in after:
        window = sample["step"] // window_steps
        if window < last_window:
            floors[window] = min(floors.get(window, sample["rss_mb"]), sample["rss_mb"])
    first = after[0]["rss_mb"] if after else None
    if len(floors) < 2:
        return {"rss_mb_after_warmup": first, "growth_per_100_steps_percent": None,
                "growth_all_samples_per_100_steps_percent": None}
    floor_slope = statistics.linear_regression([w * window_steps for w in floors], list(floors.values())).slope
    all_slope = statistics.linear_regression([s["step"] for s in after], [s["rss_mb"] for s in after]).slope
    return {"rss_mb_after_warmup": first,
            "growth_per_100_steps_percent": round(100 * floor_slope * 100 / first, 2),
            "growth_all_samples_per_100_steps_percent": round(100 * all_slope * 100 / first, 2)}
