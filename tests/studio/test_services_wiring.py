"""The settings wire the real services named in the environment (CI sets DATABASE_URL and REDIS_URL)."""

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection


def test_database_is_the_one_database_url_names():
    expected = "postgresql" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "sqlite"
    assert connection.vendor == expected


@pytest.mark.redis
def test_channel_layer_round_trips_through_real_redis():
    layer = get_channel_layer()
    assert type(layer).__name__ == "RedisChannelLayer"

    async def round_trip():
        channel = await layer.new_channel()
        await layer.group_add("wiring-check", channel)
        await layer.group_send("wiring-check", {"type": "ping", "n": 7})
        try:
            return await layer.receive(channel)
        finally:
            await layer.group_discard("wiring-check", channel)

    # A thread of its own: once a Playwright test has run, the main thread carries Playwright's event loop,
    # and async_to_sync refuses to run there.
    with ThreadPoolExecutor(1) as thread:
        assert thread.submit(asyncio.run, round_trip()).result(timeout=10) == {"type": "ping", "n": 7}


@pytest.mark.redis
def test_a_receive_waiting_past_the_layers_block_gets_the_message_sent_after_it():
    """A consumer idle for longer than one BZPOPMIN block (brpop_timeout) still receives: its read of Redis's empty
    answer does not time out first (redis-py's default socket timeout equals the block)."""
    layer = get_channel_layer()

    async def late_message():
        channel = await layer.new_channel()

        async def send_later():
            await asyncio.sleep(layer.brpop_timeout + 1)
            await layer.send(channel, {"type": "late"})

        sender = asyncio.create_task(send_later())
        try:
            return await asyncio.wait_for(layer.receive(channel), timeout=layer.brpop_timeout * 3)
        finally:
            await sender

    with ThreadPoolExecutor(1) as thread:
        assert thread.submit(asyncio.run, late_message()).result(timeout=30) == {"type": "late"}


def test_without_redis_celery_runs_tasks_in_process():
    if os.environ.get("REDIS_URL"):
        assert settings.CELERY_BROKER_URL == os.environ["REDIS_URL"] and not settings.CELERY_TASK_ALWAYS_EAGER
    else:
        assert settings.CELERY_TASK_ALWAYS_EAGER and settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith(
            "InMemoryChannelLayer")
