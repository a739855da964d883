"""Live updates of a run, sent to its channel-layer group after the writing transaction commits.

Observability never blocks training: a failed or slow send is logged and dropped; a page that missed
something fetches it from the history endpoint when it reconnects. Messages (the `type` routes them to
the consumer's handler):
  {"type": "run.step", "run": id, "step": n, "wall_time": t, "points": {name: value}, "events": [[kind, message]]}
  {"type": "run.event", "run": id, "event": {kind, message, step, created_at}}
  {"type": "run.status", "run": id, "status": s, "step": n, "requested": r}
"""

from __future__ import annotations

import logging

from django.db import transaction

log = logging.getLogger(__name__)


def group_name(run_id) -> str:
    return f"run-{run_id}"


def _send_on_commit(run_id, message: dict) -> None:
    def send():
        from asgiref.sync import async_to_sync
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(group_name(run_id), message)
        except Exception:  # a dead channel layer costs the run nothing
            log.warning("live update for run %s dropped", run_id, exc_info=True)

    transaction.on_commit(send)


def broadcast_step(*, run_id, step: int, wall_time: float, points: dict, events: list) -> None:
    _send_on_commit(run_id, {"type": "run.step", "run": str(run_id), "step": step, "wall_time": wall_time,
                             "points": points, "events": [list(e) for e in events]})


def broadcast_event(event) -> None:
    _send_on_commit(event.run_id, {"type": "run.event", "run": str(event.run_id), "event": {
        "kind": event.kind, "message": event.message, "step": event.step,
        "created_at": event.created_at.isoformat() if event.created_at else None}})


def broadcast_run(run) -> None:
    _send_on_commit(run.pk, {"type": "run.status", "run": str(run.pk), "status": run.status, "step": run.step,
                             "requested": run.requested})
