"""`manage.py sandbox exec` and `pool-status` through the real command (apps/operations)."""

import base64
import json

import pytest
from django.core.management import CommandError, call_command

from apps.registry.services import version_publish
from tests.support.sandbox import settle
from workers.sandbox import SandboxImage, SandboxPool
from workers.sandbox.process import ProcessBackend

pytestmark = pytest.mark.sandbox


def exec_json(capsys, *args) -> dict:
    capsys.readouterr()
    call_command("sandbox", "exec", *map(str, args))
    return json.loads(capsys.readouterr().out)


def test_binary_garbage_still_gives_one_valid_json_object(tmp_path, capsys, db):
    program = tmp_path / "garbage.py"
    program.write_text("import sys\nsys.stdout.buffer.write(bytes(range(256)))\nsys.stderr.write('fine')")
    result = exec_json(capsys, program)
    assert result["status"] == "ok" and result["stdout_encoding"] == "base64"
    assert base64.b64decode(result["stdout"]) == bytes(range(256)) and result["stderr"] == "fine"


def test_timeout_and_memory_flags_apply(tmp_path, capsys, db):
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(30)")
    assert exec_json(capsys, slow, "--timeout", "1")["status"] == "timeout"
    hog = tmp_path / "hog.py"
    hog.write_text("x = bytearray(400 << 20)\nprint(len(x))")
    result = exec_json(capsys, hog, "--memory-mb", "64")
    assert result["status"] == "killed" and "memory" in result["reason"]


def test_image_comes_from_the_registry(tmp_path, capsys, project, owner):
    version_publish(project=project, kind="sandbox_image", slug="with-files", author=owner, spec={
        "layers": [{"type": "base", "image": "python-3.11"},
                   {"type": "files", "files": {"data/answer.txt": "42"}}], "warm_pool_size": 0})
    program = tmp_path / "read.py"
    program.write_text("print(open('data/answer.txt').read())")
    assert exec_json(capsys, program, "--image", "with-files@1")["stdout"] == "42\n"
    with pytest.raises(CommandError, match="sandbox_image/nothing has no versions|No sandbox_image named"):
        call_command("sandbox", "exec", str(program), "--image", "nothing")


def test_pool_status_lists_the_running_pools(capsys, settings, layer_cache):
    image = SandboxImage(key="test/status@1", layers=({"type": "base", "image": "python-3.11"},), warm_pool_size=1)
    pool = SandboxPool(ProcessBackend(layers=layer_cache), status_dir=settings.SANDBOX_STATUS_DIR)
    try:
        pool.warm(image)
        settle(pool, image)
        pool._publish_status()
        call_command("sandbox", "pool-status")
        pools = json.loads(capsys.readouterr().out)["pools"]
        assert [p["images"][0]["image"] for p in pools] == ["test/status@1"]
        assert pools[0]["images"][0]["warm"] == 1
    finally:
        pool.close()
    call_command("sandbox", "pool-status")
    assert json.loads(capsys.readouterr().out)["pools"] == []
