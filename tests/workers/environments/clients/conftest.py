"""A running `manage.py environments serve` for the clients' tests: one server process on the test database for
each test module, serving a bundle of one template whose tasks are sums the model may check with `run_python`
(in a fresh sandbox per call) before it submits, so that a scripted model's answer is right or wrong on purpose.

The episodes the trainers play are read back from the archive as trajectories of their external runs."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model

from apps.accounts.models import TokenScope
from apps.accounts.services import api_token_create, project_create
from apps.registry.services import version_publish
from tests.support.environment_server import environment_server as environment_server_process
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
    with environment_server_process(bundle="sums", project="elsewhere", data_dir=world.data_dir, logs=tmp,
                                    django_db_blocker=django_db_blocker,
                                    options=("--max-sessions", "16", "--max-sessions-per-token", "16",
                                             "--idle-timeout", "120")) as (base, _):
        world.base = base
        yield world


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
