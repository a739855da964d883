"""TRL's own GRPOTrainer trains a tiny Hugging Face model for 2 steps in the studio's environments, served by a
running `manage.py environments serve`, with the studio's verdict as its reward (workers/environments/clients/
trl.py). The model is random, so its generations are scripted as TRL's own tests script them (the model's
`generate` replaced, nothing of ours): in each group of two, both check the sum with run_python (run in the
studio's sandbox); one then submits it, the other answers one less in a message. The loss is GRPO's on those
rewards, the weights move, and the studio holds the four episodes at the trainer's steps with their verdicts."""

import json
import re
from unittest.mock import patch

import pytest
import torch

from apps.runs.models import Run, RunKind
from apps.trajectories.models import Trajectory
from workers.environments.clients.trl import studio_dataset, studio_environment, studio_reward

from .conftest import TEMPLATE, task_sum

pytestmark = [pytest.mark.postgres, pytest.mark.sandbox, pytest.mark.processes]


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call><|im_end|>"


def scripted(tokenizer):
    """model.generate for TRL's tool loop: what each rollout writes next, from what it has read so far."""

    def generate(input_ids, **_):
        rows = []
        for position, ids in enumerate(input_ids):
            text = tokenizer.decode(ids, skip_special_tokens=False)
            a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1])
            results = text.count("<tool_response>")
            if results == 0:
                script = call("run_python", code=f"print({a} + {b})")
            elif results == 1:  # the group's first rollout submits the sum, the second answers in a message
                script = call("submit", answer=str(a + b)) if position == 0 else f"It is {a + b - 1}.<|im_end|>"
            else:
                script = "Done.<|im_end|>"
            rows.append(tokenizer(script, add_special_tokens=False)["input_ids"])
        width = max(map(len, rows))
        completion = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])
        return torch.cat([input_ids, completion.to(input_ids.device)], dim=-1)

    return generate


def test_grpo_trainer_learns_from_the_studios_verdicts(environment_server, tiny_tool_model, tmp_path, monkeypatch,
                                                       db):
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    directory, tokenizer = tiny_tool_model
    environment = studio_environment(environment_server.base, token=environment_server.token, run="trl-tiny-grpo",
                                     model="tiny-llama")
    assert environment.tool_names == {"run_python", "submit"}
    args = GRPOConfig(output_dir=str(tmp_path / "out"), learning_rate=0.1, per_device_train_batch_size=2,
                      num_generations=2, max_steps=2, max_completion_length=512, logging_steps=1, report_to="none",
                      save_strategy="no", use_cpu=True, chat_template_kwargs={"enable_thinking": False})
    trainer = GRPOTrainer(model=str(directory), processing_class=tokenizer, reward_funcs=studio_reward, args=args,
                          train_dataset=studio_dataset(8), environment_factory=environment)
    before = {name: parameter.clone() for name, parameter in trainer.model.named_parameters()}
    with patch.object(trainer.model, "generate", side_effect=scripted(tokenizer)):
        trainer.train()

    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in steps] == [1, 2]
    for entry in steps:
        assert entry["rewards/studio_reward/mean"] == pytest.approx(0.5)  # one of each group right: signal
        assert entry["tools/call_frequency"] == pytest.approx(1.5)  # run_python twice, submit once, per group
        assert entry["tools/failure_frequency"] == 0.0
        assert entry["loss"] != 0.0 and entry["grad_norm"] > 0.0
    assert trainer.state.log_history[-1]["train_loss"] is not None
    for name, parameter in trainer.model.named_parameters():
        assert not torch.equal(before[name], parameter), f"{name} did not change"

    run = Run.objects.get(project=environment_server.project, name="trl-tiny-grpo")
    assert run.kind == RunKind.EXTERNAL
    assert (run.config["client"], run.config["trainer_model"]) == ("trl", "tiny-llama")
    episodes = list(Trajectory.objects.filter(run=run).order_by("step", "seq"))
    assert [episode.step for episode in episodes] == [1, 1, 2, 2]  # the trainer's steps
    for step in (1, 2):
        group = [episode for episode in episodes if episode.step == step]
        assert len({episode.task_key for episode in group}) == 1  # a group plays one task, as GRPO needs
        assert sorted(episode.reward for episode in group) == [0.0, 1.0]
        assert all(episode.effective and episode.template == TEMPLATE for episode in group)
    for episode in episodes:
        answer = task_sum(episode.task_key)
        tools = [turn for turn in episode.turns if turn["role"] == "tool"]
        assert tools[0]["name"] == "run_python" and tools[0]["content"].split()[-1] == str(answer)  # the sandbox's
        assistant = [turn for turn in episode.turns if turn["role"] == "assistant"]
        assert assistant[0]["tool_calls"][0]["arguments"] == {"code": f"print({answer - 2} + 2)"}
        if episode.reward == 1.0:  # submitted: the submit call, the model's last words, the answer graded
            assert [call["name"] for call in assistant[1]["tool_calls"]] == ["submit"]
            assert [turn["content"] for turn in assistant[2:]] == ["Done.", str(answer)]
        else:  # answered in a message, graded on it
            assert assistant[-1]["content"] == f"It is {answer - 1}." and len(tools) == 1
        assert episode.verdict["layers_run"] == ["exact"]
