"""The run page's websocket: joins the run's group only after the user's membership in the run's project is
checked, then forwards what the services broadcast after each commit (live.py) to the browser as JSON."""

from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.accounts.selectors import role_of

from . import live
from .models import Run

# Closing before accept refuses the handshake (the browser sees the connection fail, learns nothing more).
CLOSE_NOT_ALLOWED = 4404


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

    async def run_step(self, message):
        await self.send_json(message)

    async def run_event(self, message):
        await self.send_json(message)

    async def run_status(self, message):
        await self.send_json(message)
