"""`manage.py bench sandbox`: figures from one run on one backend — cold start, warm acquire+run, executions/s at
concurrency 1 and 2 — and the same trivial program through a plain `subprocess.run([sys.executable, file])` as
the baseline."""

import subprocess
import sys
import tempfile
import threading
import time

from workers.sandbox.interface import SandboxBackend
from workers.sandbox.pool import SandboxPool, latency_summary
from workers.sandbox.types import Execution, SandboxImage

TRIVIAL = "print(sum(range(100)))"
IMAGE = SandboxImage(key="bench/python@1", layers=({"type": "base", "image": "python-3.11"},), warm_pool_size=2)


def _throughput(pool: SandboxPool, concurrency: int, seconds: float) -> float:
    done, deadline = [0] * concurrency, time.monotonic() + seconds

    def work(index):
        while time.monotonic() < deadline:
            with pool.acquire(IMAGE) as lease:
                lease.run(Execution(program=TRIVIAL))
            done[index] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return round(sum(done) / (time.monotonic() - started), 1)


def run(*, backend: SandboxBackend, samples: int = 100, **_) -> dict:
    backend_impl = backend
    backend_impl.start(IMAGE).destroy()  # builds the image's layers once, outside the measurements

    cold = []
    for _ in range(max(10, samples // 5)):
        started = time.perf_counter()
        sandbox = backend_impl.start(IMAGE)
        cold.append(time.perf_counter() - started)
        sandbox.destroy()

    pool = SandboxPool(backend_impl)
    pool.warm(IMAGE)
    try:
        while pool.status()[0]["warm"] < IMAGE.warm_pool_size:
            time.sleep(0.01)
        warm = []
        for _ in range(samples):
            started = time.perf_counter()
            with pool.acquire(IMAGE) as lease:
                result = lease.run(Execution(program=TRIVIAL))
            warm.append(time.perf_counter() - started)
            assert result.stdout == b"4950\n", result
            while pool.status()[0]["warm"] < IMAGE.warm_pool_size:  # measure warm acquires, not resets
                time.sleep(0.001)
        per_second = {f"concurrency_{c}": _throughput(pool, c, 5.0) for c in (1, 2)}
    finally:
        pool.close()

    with tempfile.NamedTemporaryFile("w", suffix=".py") as handle:
        handle.write(TRIVIAL)
        handle.flush()
        baseline = []
        for _ in range(max(20, samples // 2)):
            started = time.perf_counter()
            subprocess.run([sys.executable, handle.name], capture_output=True, check=True)
            baseline.append(time.perf_counter() - started)

    warm_summary, baseline_summary = latency_summary(warm), latency_summary(baseline)
    return {
        "backend": backend_impl.name, "program": TRIVIAL,
        "cold_start": latency_summary(cold), "warm_acquire_run": warm_summary, "executions_per_second": per_second,
        "baseline_subprocess_run": {**baseline_summary, "executable": sys.executable},
        "warm_speedup_vs_baseline_p50": round(baseline_summary["p50_ms"] / warm_summary["p50_ms"], 1),
    }
