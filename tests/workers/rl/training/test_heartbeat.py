"""A heartbeat means progress: an attempt that stops making any stops heartbeating (so the watchdog takes its run
for lost and resumes it elsewhere) and is abandoned at its next check. No Django: the studio's side is in
tests/e2e/test_embedded_stop.py; a process asked to stop ends its run interrupted instead
(tests/workers/rl/test_training_pipeline.py)."""

import threading
import time

import pytest

from workers.rl.protocols import AttemptAbandoned
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.training.tracking import Heartbeat, MemoryTracker


def test_the_heartbeat_goes_on_while_the_work_progresses_and_stops_when_it_does_not():
    tracker = MemoryTracker()
    heartbeat = Heartbeat(tracker, seconds=0.02, stuck_after=0.3)
    heartbeat.start()
    try:
        for _ in range(10):  # 0.5 s of progress every 0.05 s: longer than stuck_after, never stalled
            heartbeat.progressed()
            time.sleep(0.05)
        assert not heartbeat.stalled and tracker.heartbeats > 5
        time.sleep(0.6)  # no progress
        assert heartbeat.stalled
        beats = tracker.heartbeats
        time.sleep(0.1)
        assert tracker.heartbeats == beats, "a stalled attempt must not keep its run's heartbeat fresh"
    finally:
        heartbeat.stop()


class HangingVerifier:
    """A verifier that stops answering after its first `answers` verdicts (a sandbox or judge that hangs)."""

    def __init__(self, answers: int):
        self.inner, self.answers, self.released = LocalVerifier(pool=None), answers, threading.Event()
        self._lock = threading.Lock()

    def verify(self, template, trajectory, item):
        with self._lock:
            self.answers -= 1
            hang = self.answers < 0
        if hang:
            self.released.wait(30)
        return self.inner.verify(template, trajectory, item)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_pipeline_stuck_in_verification_is_abandoned_and_stops_heartbeating(make_pipeline, mode):
    pipeline, tracker = make_pipeline(50, mode=mode, groups_per_step=2, group_size=4, checkpoint_every=1)
    hanging = pipeline.verifier = HangingVerifier(answers=3 * 2 * 4)  # three steps' worth, then it hangs
    pipeline.heartbeat.stuck_after = 1.0
    started = time.monotonic()
    try:
        with pytest.raises(AttemptAbandoned, match="no progress for 1 s at step") as abandoned:
            pipeline.run()
    finally:
        hanging.released.set()
    assert time.monotonic() - started < 30
    recorded = [s["step"] for s in tracker.steps]  # async: groups rolled out ahead took some of the answers
    assert 1 <= len(recorded) <= 3 and recorded == tracker.checkpoints == list(range(1, len(recorded) + 1))
    assert f"at step {recorded[-1]}" in str(abandoned.value)
    beats = tracker.heartbeats
    time.sleep(0.3)
    assert tracker.heartbeats == beats
