"""`manage.py bench archive` at a tiny size: every figure is there and sane, and the bench leaves nothing behind."""

import json

import pytest
from django.core.management import call_command

from apps.runs.models import Run
from apps.trajectories.models import Trajectory

TINY = ["--json", "--steps", "2", "--step-sizes", "2", "4", "--artifact-objects", "4", "--artifact-mb", "1"]


def _bench(capsys, *extra) -> dict:
    capsys.readouterr()
    call_command("bench", "archive", *TINY, *extra)
    return json.loads(capsys.readouterr().out)


def _assert_writes(figures: dict) -> None:
    trajectories = figures["trajectories"]
    assert (trajectories["turns"], trajectories["verdict_components"], trajectories["sampled_tokens"]) == (4, 3, 400)
    assert trajectories["json_bytes_per_row"] > trajectories["json_bytes_token_ids_and_logprobs"] > 5_000
    assert [r["step_size"] for r in trajectories["one_writer"]] == [2, 4]
    for row in [*trajectories["one_writer"], trajectories["one_writer_with_png"]]:
        assert row["rows"] == row["step_size"] * 2
        assert row["rows_per_s"] > 0 and 0 < row["step_p50_ms"] <= row["step_p95_ms"]
        assert row["writer_cpu_ms_per_row"] > 0
    assert trajectories["one_writer_with_png"]["png_bytes"] > 1000
    local = figures["artifacts"]["local"]
    for size in ("small", "large"):
        assert local[size]["mb_per_s"] > 0 and local[size]["mb_per_s_synced"] > 0
    s3 = figures["artifacts"]["s3"]
    assert "skipped" in s3 or s3["large"]["mb_per_s"] > 0, s3
    assert not Run.objects.exists() and not Trajectory.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_writes_on_any_database(capsys):
    figures = _bench(capsys, "--writers", "1", "--subscribers", "0")
    _assert_writes(figures)
    assert figures["trajectories"]["concurrent_writers"] == {"skipped": "needs PostgreSQL and --writers above 1"}
    assert figures["fanout"] == {"skipped": "no subscribers asked for"}


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_writers_and_fanout_on_postgres_and_redis(capsys):
    figures = _bench(capsys, "--writers", "2", "--subscribers", "3", "--messages", "30")
    _assert_writes(figures)
    trajectories = figures["trajectories"]
    assert trajectories["table_bytes_per_row"] > 1000
    assert trajectories["one_writer"][0]["wal_bytes_per_row"] > 1000
    writers = trajectories["concurrent_writers"]
    assert (writers["rows"], writers["errors"], len(writers["rows_per_s_each"])) == (2 * 2 * 64, [], 2)
    fanout = figures["fanout"]
    assert "error" not in fanout, fanout.get("server_log_tail")
    assert (fanout["delivered"], fanout["lost"], fanout["stalled_windows"]) == (90, 0, 0)
    assert fanout["messages_per_s"] > 0 and fanout["latency_p50_ms"] <= fanout["latency_p95_ms"]
    assert fanout["server_cpu_s_per_1000"] > 0 and fanout["clients_cpu_s_per_1000"] > 0
