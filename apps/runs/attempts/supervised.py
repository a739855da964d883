"""An SFT or DPO run's attempt: the run's model without an engine (nothing is sampled) trained on the dataset
its config pins (workers/rl/training/supervised_pipeline.py), with checkpoints, heartbeats and resume as a GRPO
run has them. The bundle, if the run has one, gives the model's settings and, for the built-in demo model, the tasks
its base model is pretrained on; a run on its dataset alone pretrains that model on the dataset's conversations."""

from __future__ import annotations

from django.conf import settings

from apps.common import wiring
from apps.registry.pins import bundle_tasks
from workers.rl.session import build_supervised_pipeline

from ..dataset_pins import dataset_here
from ..stages import start_weights
from .base import Attempt, process_exiting


class SupervisedAttempt(Attempt):
    beats_itself = True  # the pipeline beats it, on its own thread and at every step's end

    def execute(self) -> dict:
        run = self.run
        config = dataset_here(project=run.project, config=self.config)  # a dataset version's file on this host
        tasks = bundle_tasks(bundle=run.bundle) if run.bundle is not None else None
        model = self.closing(wiring.run_model(config, tasks, dataset_file=config.dataset_file,
                                              progress=self.pretrain_progress, sampling=False))
        start_weights(model, run)  # another run's checkpoint (SFT, then DPO), before the reference is computed
        pipeline = build_supervised_pipeline(run_id=str(run.pk), kind=run.kind, config=config,
                                             total_steps=run.steps_total, model=model, tracker=self.tracker,
                                             checkpoint_dir=wiring.checkpoint_dir(run.pk), progress=self.progress,
                                             stop=process_exiting, stuck_after=settings.RUN_STUCK_SECONDS)
        return pipeline.run()
