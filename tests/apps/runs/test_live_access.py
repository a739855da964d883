"""The run websocket checks membership again before forwarding (apps/runs/consumers.py): a member removed from
the project stops receiving the run's stream once ACCESS_RECHECK_SECONDS have passed since the last check — the
next broadcast is not delivered, and the socket closes with 4404 — while the members who stay keep receiving.

Broadcasts are the real ones: run_step_record's, sent by live.py after its transaction commits (hence a
transactional test), through whichever channel layer the settings name (Redis in CI)."""

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from apps.accounts.models import Membership
from apps.runs import consumers
from apps.runs.services import run_step_record

RECHECK = 0.3  # seconds, for the test (the module's constant is 5)


def socket(run, cookie: str) -> WebsocketCommunicator:
    from studio.asgi import application

    headers = [(b"origin", b"http://127.0.0.1"), (b"cookie", f"sessionid={cookie}".encode())]
    return WebsocketCommunicator(application, f"/ws/runs/{run.pk}/", headers=headers)


@pytest.mark.django_db(transaction=True)
def test_a_removed_member_gets_no_more_broadcasts_and_the_socket_closes(monkeypatch, owner, member, project,
                                                                          session_cookie, studio_run):
    monkeypatch.setattr(consumers, "ACCESS_RECHECK_SECONDS", RECHECK)
    run, attempt = studio_run
    viewer = member("viewer")
    cookies = {"viewer": session_cookie(viewer), "owner": session_cookie(owner)}

    @database_sync_to_async
    def write_step(step: int):
        run_step_record(run_id=run.pk, attempt=attempt, step=step, wall_time=float(step),
                        points={"reward/mean": step / 100}, trajectories=[])

    @database_sync_to_async
    def remove_viewer():
        Membership.objects.filter(project=project, user=viewer).delete()

    @async_to_sync
    async def scenario():
        seen = {}
        sockets = {who: socket(run, cookie) for who, cookie in cookies.items()}
        for who, communicator in sockets.items():
            connected, _ = await communicator.connect(timeout=5)
            assert connected, who
        await write_step(31)
        for who, communicator in sockets.items():
            seen[(who, 31)] = await communicator.receive_json_from(timeout=5)

        await remove_viewer()
        await asyncio.sleep(RECHECK * 2)  # the next broadcast is due a check
        await write_step(32)
        seen[("owner", 32)] = await sockets["owner"].receive_json_from(timeout=5)
        seen[("viewer", "after removal")] = await sockets["viewer"].receive_output(timeout=5)

        await write_step(33)
        seen[("owner", 33)] = await sockets["owner"].receive_json_from(timeout=5)
        seen[("viewer", "later")] = await sockets["viewer"].receive_nothing(timeout=RECHECK * 2)
        for communicator in sockets.values():
            await communicator.disconnect()
        return seen

    seen = scenario()
    for who in ("viewer", "owner"):
        assert seen[(who, 31)]["type"] == "run.step" and seen[(who, 31)]["step"] == 31, who
    assert seen[("viewer", "after removal")] == {"type": "websocket.close", "code": consumers.CLOSE_NOT_ALLOWED}
    assert seen[("viewer", "later")] is True  # nothing more reached the removed member's socket
    assert seen[("owner", 32)]["step"] == 32 and seen[("owner", 33)]["step"] == 33
    assert seen[("owner", 32)]["points"] == {"reward/mean": 0.32}


@pytest.mark.django_db(transaction=True)
def test_a_member_who_stays_keeps_receiving_after_each_check(monkeypatch, owner, session_cookie, studio_run):
    monkeypatch.setattr(consumers, "ACCESS_RECHECK_SECONDS", 0.0)  # every broadcast checks
    run, attempt = studio_run
    cookie = session_cookie(owner)

    @database_sync_to_async
    def write_step(step: int):
        run_step_record(run_id=run.pk, attempt=attempt, step=step, wall_time=float(step), points={"x": 1.0},
                        trajectories=[])

    @async_to_sync
    async def scenario():
        communicator = socket(run, cookie)
        assert (await communicator.connect(timeout=5))[0]
        steps = []
        for step in (31, 32, 33):
            await write_step(step)
            steps.append((await communicator.receive_json_from(timeout=5))["step"])
        await communicator.disconnect()
        return steps

    assert scenario() == [31, 32, 33]
