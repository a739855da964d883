"""The settings wire the real services named in the environment (CI sets DATABASE_URL and REDIS_URL)."""

import os

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

needs_redis = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis: set REDIS_URL (CI does)")


def test_database_is_the_one_database_url_names():
    expected = "postgresql" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "sqlite"
    assert connection.vendor == expected


@needs_redis
def test_channel_layer_round_trips_through_real_redis():
    layer = get_channel_layer()
    assert type(layer).__name__ == "RedisChannelLayer"
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)("wiring-check", channel)
    async_to_sync(layer.group_send)("wiring-check", {"type": "ping", "n": 7})
    assert async_to_sync(layer.receive)(channel) == {"type": "ping", "n": 7}
    async_to_sync(layer.group_discard)("wiring-check", channel)


def test_without_redis_celery_runs_tasks_in_process():
    if os.environ.get("REDIS_URL"):
        assert settings.CELERY_BROKER_URL == os.environ["REDIS_URL"] and not settings.CELERY_TASK_ALWAYS_EAGER
    else:
        assert settings.CELERY_TASK_ALWAYS_EAGER and settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith(
            "InMemoryChannelLayer")
