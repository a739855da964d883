"""Helpers for tests that train a pipeline in process."""

from workers.rl.training.tracking import MemoryTracker


def pause_after(step_number: int) -> MemoryTracker:
    """A tracker that asks the pipeline to pause once step `step_number` is recorded (as the run page's button
    does), so a test can resume from the checkpoint that pause writes."""
    tracker = MemoryTracker()

    def on_step(step, _points):
        if step == step_number:
            tracker.requested = "pause"

    tracker.on_step = on_step
    return tracker
