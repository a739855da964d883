"""Live updates of a run, sent to its channel-layer group after the writing transaction commits.

Observability never blocks training: a failed or slow send is logged and dropped; a page that missed
something fetches it from the history endpoint when it reconnects. Messages (the `type` routes them to
the consumer's handler):
  {"type": "run.step", "run": id, "step": n, "wall_time": t, "points": {name: value}, "domains": d,
   "events": [[kind, message]]}
A step's per-domain points (reward/<domain>, eval/reward/<domain>) are not sent: a run of a thousand domains would
send a thousand a step to every page. `domains` says how many the step wrote; the page reads them from its domains
endpoint, a page of them at a time, at a bounded rate (static/js/run_domains.js). So a step's message is the same
size at 1,000 domains as at 10.
  {"type": "run.event", "run": id, "event": {id, kind, message, step, created_at}}
  {"type": "run.status", "run": id, "status": s, "step": n, "requested": r}
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from django.db import transaction

from apps.common.series import is_per_domain

log = logging.getLogger(__name__)

# The event loop of the server that holds this process's websockets (embedded mode), set by the consumer.
_server_loop: asyncio.AbstractEventLoop | None = None


def bind_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Called by the run consumer on connect. The in-memory channel layer is plain asyncio queues: a
    group_send from another thread (a training thread, through async_to_sync and a loop of its own) fills the
    queue but never wakes the server's loop, so a point would sit there until something else woke it. Sends
    from other threads are therefore handed to the server's loop itself."""
    global _server_loop
    _server_loop = loop


_sender: ThreadPoolExecutor | None = None


def _group_send(layer, group: str, message: dict) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import InMemoryChannelLayer

    global _sender
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    loop = _server_loop
    if isinstance(layer, InMemoryChannelLayer) and loop is not None and not loop.is_closed() and running is not loop:
        # Fire and forget: observability never waits on a page.
        asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop)
    elif running is not None:
        # Sync code called from inside an event loop (a notebook, a test driving a browser): async_to_sync
        # cannot run here, so one sender thread does it, keeping the messages in order.
        if _sender is None:
            _sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="live-send")
        _sender.submit(async_to_sync(layer.group_send), group, message)
    else:
        async_to_sync(layer.group_send)(group, message)


def group_name(run_id) -> str:
    return f"run-{run_id}"


def _send_on_commit(run_id, message: dict) -> None:
    def send():
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        try:
            _group_send(layer, group_name(run_id), message)
        except Exception:  # a dead channel layer costs the run nothing
            log.warning("live update for run %s dropped", run_id, exc_info=True)

    transaction.on_commit(send)


def step_message(*, run_id, step: int, wall_time: float, points: dict, events: list) -> dict:
    """The run.step message of one step: its points less the per-domain ones, which it counts."""
    shared = {name: value for name, value in points.items() if not is_per_domain(name)}
    return {"type": "run.step", "run": str(run_id), "step": step, "wall_time": wall_time, "points": shared,
            "domains": len(points) - len(shared), "events": [list(e) for e in events]}


def broadcast_step(*, run_id, step: int, wall_time: float, points: dict, events: list) -> None:
    _send_on_commit(run_id, step_message(run_id=run_id, step=step, wall_time=wall_time, points=points,
                                         events=events))


def broadcast_event(event) -> None:
    _send_on_commit(event.run_id, {"type": "run.event", "run": str(event.run_id), "event": {
        "id": event.id, "kind": event.kind, "message": event.message, "step": event.step,
        "created_at": event.created_at.isoformat() if event.created_at else None}})


def broadcast_run(run) -> None:
    _send_on_commit(run.pk, {"type": "run.status", "run": str(run.pk), "status": run.status, "step": run.step,
                             "requested": run.requested})
