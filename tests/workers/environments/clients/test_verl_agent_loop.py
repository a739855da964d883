"""verl's agent loop for the studio (workers/environments/clients/verl_agent_loop.py), run as verl's own
AgentLoopWorker runs an agent loop (tests/workers/environments/clients/verl_rollouts.py: verl's config, registry,
hydra instantiate, ToolAgentLoop, hermes parser, AgentLoopOutput's tensors; the LLM server scripted), against a
running `manage.py environments serve`: the studio's verdicts become verl's rewards and the studio holds the
episodes.

verl 0.9.1 pins transformers<5.11 and Ray, so it cannot share the studio's environment (transformers 5.24): the
rollouts run in an environment of its own, named by STUDIO_VERL_PYTHON, and without one this test is skipped (CI
has none: the environment is 2.1 GB). To run it:

    python3.11 -m venv .venv-verl && .venv-verl/bin/pip install verl==0.9.1 openenv-core==0.3.0 torch==2.13.0
    STUDIO_VERL_PYTHON=.venv-verl/bin/python .venv/bin/pytest tests/workers/environments/clients/test_verl_agent_loop.py
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from apps.runs.models import Run, RunKind
from apps.trajectories.models import Trajectory

from .conftest import TEMPLATE, task_sum

VERL_PYTHON = os.environ.get("STUDIO_VERL_PYTHON", "")

pytestmark = [pytest.mark.postgres, pytest.mark.sandbox, pytest.mark.processes,
              pytest.mark.skipif(not VERL_PYTHON, reason="verl runs in an environment of its own: set "
                                                         "STUDIO_VERL_PYTHON to its python (this module's docstring)")]


def test_verl_agent_loop_plays_studio_episodes_with_its_verdicts_as_rewards(environment_server, tiny_tool_model,
                                                                            tmp_path, db):
    directory, _ = tiny_tool_model
    out = tmp_path / "rollouts.json"
    finished = subprocess.run([VERL_PYTHON, str(Path(__file__).with_name("verl_rollouts.py")), environment_server.base,
                               environment_server.token, "verl-tiny", str(directory), str(out)],
                              capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    submitted, answered = json.loads(out.read_text())

    assert (submitted["loop"], submitted["reward_score"], answered["reward_score"]) == ("StudioAgentLoop", 1.0, 0.0)
    for rollout in (submitted, answered):
        assert rollout["rm_score_last"] == rollout["rm_score_sum"] == rollout["reward_score"]  # verl's reward
        assert rollout["extra_fields"]["studio_scored"] is True
        assert rollout["trained_tokens"] > 0 and rollout["masked_tokens"] > 0  # the tool results are masked
    assert "submitted" in submitted["response"] and submitted["num_turns"] == 5  # it stopped at submit
    assert answered["response"].rstrip().endswith("<|im_end|>") and "It is" in answered["response"]

    run = Run.objects.get(project=environment_server.project, name="verl-tiny")
    assert run.kind == RunKind.EXTERNAL
    assert (run.config["client"], run.config["trainer_model"]) == ("verl", "tiny-llama")
    episodes = {str(episode.pk): episode for episode in Trajectory.objects.filter(run=run)}
    first, second = episodes[submitted["extra_fields"]["studio_episode"]], \
        episodes[answered["extra_fields"]["studio_episode"]]
    assert len(episodes) == 2 and first.task_key == second.task_key and first.template == TEMPLATE  # one seed
    answer = task_sum(first.task_key)
    assert (first.reward, second.reward) == (1.0, 0.0)
    assert [t["content"] for t in first.turns if t["role"] == "tool"][0].split()[-1] == str(answer)  # the sandbox's
    assert first.turns[-1]["content"] == str(answer)
    assert second.turns[-1]["content"] == f"It is {answer - 1}."  # what the model said, without verl's markup
