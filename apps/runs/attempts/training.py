"""A GRPO training run's attempt: wire the engine from the run's pinned bundle and config, build its pipeline,
run it. A data-parallel run (data_parallel: N) is trained by N processes under torchrun (apps/runs/ranks.py),
which this attempt starts and waits for.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from apps.common import wiring
from apps.registry.pins import bundle_tasks
from workers.rl.session import build_pipeline
from workers.rl.training import distributed

from ..models import RunStatus
from ..stages import start_weights
from .base import Attempt, Unfinished, fail_attempt, process_exiting, remove_weights

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[3]


class TrainingAttempt(Attempt):
    beats_itself = True

    def carry_out(self) -> dict | Unfinished:
        if self.config.data_parallel > 1 and distributed.current() is None:
            return self.run_on_ranks(self.config.data_parallel)
        return super().carry_out()

    def execute(self) -> dict:
        run, config = self.run, self.config
        tasks = bundle_tasks(bundle=run.bundle, config=config)
        model = self.closing(wiring.run_model(config, tasks, progress=self.pretrain_progress, run_id=run.pk))
        start_weights(model, run)  # another run's checkpoint (a stage), before the pipeline restores its own
        pool = self.closing(wiring.sandbox_pool())
        for template in tasks.templates.values():
            pool.warm(template.image)
        tool_runner, verifier = wiring.run_runners(pool, config)
        pipeline = build_pipeline(run_id=str(run.pk), config=config, total_steps=run.steps_total, tasks=tasks,
                                  model=model, tool_runner=tool_runner, verifier=verifier, tracker=self.tracker,
                                  checkpoint_dir=wiring.checkpoint_dir(run.pk), prices=wiring.prices(),
                                  progress=self.progress, stop=process_exiting,
                                  stuck_after=settings.RUN_STUCK_SECONDS)
        return pipeline.run()

    def finished(self, summary: dict) -> None:
        if summary["outcome"] not in ("paused", "interrupted"):  # those publish their weights again as they resume
            remove_weights(self.run.pk)

    def run_on_ranks(self, processes: int) -> dict | Unfinished:
        """`processes` processes on this host started by torchrun (apps/runs/ranks.py), whose rank 0 runs this very
        attempt (the lease, heartbeats, archive, checkpoints, the run's last word) and writes how it ended to a file:
        the summary, or how it stopped without a verdict (taken over, left to resume), which this process, waiting for
        them, returns as its own. (A file, not rank 0's exit status: torchrun exits 1 whichever status a rank exits
        with.) They inherit this process's environment (database, storage, devices); their output goes to a log
        file in the data directory. If they exit without rank 0 saying how — a rank killed, out of memory — the
        attempt fails with the log's tail, unless another worker has taken the run over meanwhile."""
        run, attempt = self.run, self.attempt
        logs = Path(settings.DATA_DIR) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"run-{run.pk}-attempt-{attempt}.log"
        ending_path = logs / f"run-{run.pk}-attempt-{attempt}.ending.json"
        ending_path.unlink(missing_ok=True)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
                   "--module", "apps.runs.ranks", f"{run.pk}:{attempt}", str(ending_path)]
        log.info("run %s attempt %s: training on %d processes (%s)", run.pk, attempt, processes, log_path)
        with log_path.open("w") as output:
            done = subprocess.run(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
        if ending_path.is_file():
            ending = json.loads(ending_path.read_text())
            return Unfinished(ending) if isinstance(ending, str) else ending
        run.refresh_from_db()
        if run.attempt != attempt:
            log.warning("run %s attempt %s was taken over while its processes trained", run.pk, attempt)
            return Unfinished.TAKEN_OVER
        tail = log_path.read_text(errors="replace")[-3000:]
        if run.status == RunStatus.RUNNING:  # rank 0 did not get to say why: a rank was killed, or torchrun failed
            fail_attempt(run.pk, attempt, f"the {processes} trainer processes exited with {done.returncode} "
                                          f"({log_path}):\n{tail}")
        raise RuntimeError(f"run {run.pk} attempt {attempt}: the trainer processes exited with {done.returncode}; "
                           f"see {log_path}")
