"""A running `manage.py environments serve` for the clients' tests: one server process on the test database for
each test module, serving a bundle of one template whose tasks are sums the model may check with `run_python`
(in a fresh sandbox per call) before it submits, so that a scripted model's answer is right or wrong on purpose.

The episodes the trainers play are read back from the archive as trajectories of their external runs."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from apps.accounts.models import TokenScope
from apps.accounts.services import api_token_create, project_create
from apps.registry.services import version_publish
from tests.support import ROOT
from tests.support.processes import database_url, wait_for
from tests.support.resources import require
from workers.rl.models.hf_tiny import make_tiny_hf_model
from workers.rl.rollout.tools import RUN_PYTHON_TOOL

PROMPT = "What is {a} + {b}? Check it with run_python, then submit the sum."
SUMS = [{"key": f"sum-{a}", "inputs": {"a": a, "b": 2}, "hidden": {"answer": a + 2}} for a in range(8)]
TEMPLATE = "task_template/checked-sums@1"


def _publish_world(tmp: Path) -> SimpleNamespace:
    """The bundle `sums` of project `elsewhere`, and a token of the environment scope; committed, for the server
    process to read."""
    owner = get_user_model().objects.create_user("trainer", password="pw-for-tests")
    project = project_create(team_slug="elsewhere", slug="elsewhere", name="Trained elsewhere", owner=owner)
    for kind, slug, spec, extra in (
            ("sandbox_image", "python", {"layers": [{"type": "base", "image": "python-3.11"}], "warm_pool_size": 2},
             {}),
            ("verifier", "exact-sum", {"layers": [{"name": "exact", "kind": "exact", "checks": [
                {"type": "numeric", "reference": "{answer}"}]}]}, {}),
            ("task_template", "checked-sums", {"prompt_template": PROMPT, "sandbox_image": "python",
                                               "verifier": "exact-sum", "tools": [RUN_PYTHON_TOOL],
                                               "limits": {"max_turns": 4, "max_tokens": 512, "max_seconds": 60}},
             {"instances": SUMS}),
            ("domain", "sums", {"templates": [{"template": "checked-sums", "weight": 1.0}]}, {}),
            ("bundle", "sums", {"members": ["domain/sums@latest"]}, {})):
        version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner, via="cli", **extra)
    token = api_token_create(user=owner, name="trainer-token", project=project, scope=TokenScope.ENVIRONMENT,
                             via="api")[1]
    return SimpleNamespace(project=project, owner=owner, token=token, data_dir=tmp / "data", logs=tmp)


# Module-scoped: a "package" fixture of a folder without __init__.py lives as long as the test process, and what it
# committed (its project) would be there for every later test of that process.
@pytest.fixture(scope="module")
def environment_server(django_db_setup, django_db_blocker, tmp_path_factory):
    """The server process serving bundle `sums`; `.base` its URL, `.token` a token of the environment scope."""
    require("postgres", "sandbox")
    tmp = tmp_path_factory.mktemp("environments")
    with django_db_blocker.unblock():
        world = _publish_world(tmp)
        environment = {**os.environ, "DATABASE_URL": database_url(), "STUDIO_DATA_DIR": str(world.data_dir)}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp / "server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "environments", "serve", "--bundle", "sums", "--project", "elsewhere",
         "--port", str(port), "--max-sessions", "16", "--max-sessions-per-token", "16", "--idle-timeout", "120"],
        cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    world.base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(world.base, process), seconds=90, what="the environment server", logs=tmp)
        yield world
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0)  # what the module committed goes with it


def _healthy(base: str, process) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"the environment server exited with {process.returncode}")
    try:
        return httpx.get(f"{base}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def task_sum(key: str) -> int:
    """The right answer of task `key` (sum-A: A + 2)."""
    return int(key.removeprefix("sum-")) + 2


@pytest.fixture
def tiny_tool_model(tmp_path):
    """A tiny random Llama whose tokenizer has Qwen3's chat template, which TRL knows how to parse tool calls from
    (trl.chat_template_utils) and verl's hermes parser reads; long enough a context for its tool instructions.
    Returns (its directory, its tokenizer)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    directory = make_tiny_hf_model(tmp_path / "tiny", hidden_size=32, layers=2, heads=2, max_positions=2048)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = qwen3_chat_template
    tokenizer.save_pretrained(directory)
    return directory, tokenizer
