"""The run page's websocket: joins the run's group only after the user's membership in the run's project is
checked, then forwards what the services broadcast after each commit (live.py) to the browser as JSON.

Membership is checked again before forwarding, at most every ACCESS_RECHECK_SECONDS: a member removed from the
project stops receiving the run's stream within that time, and the socket is closed."""

from __future__ import annotations

import asyncio
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.accounts.selectors import role_of

from . import live
from .models import Run

# Closing before accept refuses the handshake (the browser sees the connection fail, learns nothing more).
CLOSE_NOT_ALLOWED = 4404
ACCESS_RECHECK_SECONDS = 5.0


@database_sync_to_async
def _may_watch(user, run_id) -> bool:
    run = Run.objects.select_related("project").filter(pk=run_id).first()
    return run is not None and role_of(user=user, project=run.project) is not None


class RunConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        if user is None or not user.is_authenticated or not await _may_watch(user, run_id):
            await self.close(code=CLOSE_NOT_ALLOWED)
            return
        live.bind_server_loop(asyncio.get_running_loop())
        self.user, self.run_id, self.checked_at = user, run_id, time.monotonic()
        self.group = live.group_name(run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content, **kwargs):
        """The page only listens; a ping is answered so it can tell a quiet run from a dead socket."""
        if content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def forward(self, message):
        if self.group is None:
            return  # access was withdrawn; what was already queued for this socket is dropped
        if time.monotonic() - self.checked_at > ACCESS_RECHECK_SECONDS:
            if not await _may_watch(self.user, self.run_id):
                await self.channel_layer.group_discard(self.group, self.channel_name)
                self.group = None
                await self.close(code=CLOSE_NOT_ALLOWED)
                return
            self.checked_at = time.monotonic()
        await self.send_json(message)

    run_step = run_event = run_status = forward
