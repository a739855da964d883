"""The studio's environments for verifiers (0.3, its classic environments): `load_environment(...)`, which
prime-rl, SkyRL, Tinker and the other trainers that load environments through verifiers take, and every episode
recorded in the studio as a trajectory of the trainer's run.

    import verifiers as vf
    env = vf.load_environment("workers.environments.clients.verifiers_env", url="http://127.0.0.1:8200",
                              run="prime-rl-1", model="Qwen3-4B", examples=512)   # token: STUDIO_TOKEN

What it is, in verifiers' own terms:
- the dataset: `examples` rows, each a seed (and the `template`, `task`, `domain` asked for), from which the studio
  draws the task as a run draws it: a group of rollouts of one row plays one task. The row's prompt is a stand-in
  until the rollout starts;
- a rollout is an episode on a WebSocket session of its own (session.py): its setup resets the episode and takes
  its prompt and its tools (the template's own, and submit) as the rollout's prompt and `tool_defs`;
- tools are studio session calls: each call the model makes runs in the studio's sandbox; `submit` ends the
  episode with the conversation as the episode's turns, and the studio's layered verifier grades it. A rollout that
  ends on a message without submitting (or at the turn limit) is graded on that message, as the studio grades its
  own rollouts; one that fails (its model's server, say) is left, and the studio records it as abandoned;
- the rubric is the studio's verifier: the reward the studio returned (`studio_reward`), and `studio_scored` (weight
  0, logged only: 0 where the studio could not grade the episode, an infrastructure error).
verifiers tells an environment no trainer step, so the studio records these episodes in the order they end.
"""

from __future__ import annotations

import json
import os

import verifiers as vf
from datasets import Dataset
from verifiers.types import Messages, State, Tool, ToolMessage
from verifiers.utils.message_utils import normalize_messages

from .session import SUBMIT, EnvironmentSession

CHOICE = ("seed", "domain", "template", "task")
STAND_IN = "(the studio draws this row's task when its rollout starts)"


class StudioEnv(vf.MultiTurnEnv):
    """Each rollout one studio episode: its prompt and tools from the reset, its tool calls made in the studio,
    its reward the studio's verdict."""

    def __init__(self, *, url: str, token: str | None, run: str | None, model: str, dataset: Dataset,
                 max_turns: int = 16, **kwargs):
        rubric = vf.Rubric(funcs=[studio_reward, studio_scored], weights=[1.0, 0.0])
        super().__init__(dataset=dataset, eval_dataset=dataset, rubric=rubric, max_turns=max_turns, **kwargs)
        self.connection = {"url": url, "token": token, "run": run, "model": model}
        self.sessions: dict[str, EnvironmentSession] = {}  # rollout (trajectory_id) -> its session

    async def setup_state(self, state: State) -> State:
        session = EnvironmentSession(**self.connection, client="verifiers")
        self.sessions[state["trajectory_id"]] = session
        info = state.get("info") or {}
        opening = await session.open_episode(**{name: info[name] for name in CHOICE if info.get(name) is not None})
        state["prompt"] = normalize_messages(opening.messages, field_name="prompt")
        state["tool_defs"] = [Tool(name=t["name"], description=t["description"], parameters=t["parameters"])
                              for t in opening.tools]
        state["studio"] = {"episode": opening.episode_id, "run": opening.run, "template": opening.template,
                           "task": opening.task}
        if opening.done:  # its sandbox could not be prepared: recorded as an infrastructure error, nothing to play
            state["studio_reward"] = None
            state["final_env_response"] = []
        return state

    @vf.stop
    async def answered(self, state: State) -> bool:
        """The model wrote a message and called no tool: its final answer."""
        if not state["trajectory"]:
            return False
        last = state["trajectory"][-1]["completion"][-1]
        return last.role == "assistant" and not getattr(last, "tool_calls", None)

    async def env_response(self, messages: Messages, state: State, **kwargs) -> Messages:
        session = self.sessions[state["trajectory_id"]]
        replies = []
        for call in messages[-1].tool_calls or []:
            try:
                arguments = json.loads(call.arguments or "{}")
            except ValueError:
                arguments = None
            if not isinstance(arguments, dict):
                replies.append(ToolMessage(tool_call_id=call.id, content="[not run: the call's arguments must be a "
                                                                         "JSON object]"))
                continue
            if call.name == SUBMIT:
                reply = await session.submit(answer=arguments.get("answer"), messages=plain(messages))
            else:
                reply = await session.call(call.name, arguments)
            replies.append(ToolMessage(tool_call_id=call.id, content=reply.text))
            if reply.done:
                state["studio_reward"], state["studio_outcome"] = reply.reward, reply.outcome
                state["final_env_response"] = replies
                break
        return replies

    @vf.cleanup
    async def conclude(self, state: State) -> None:
        """After the rollout (its completion rendered): an episode still going is graded on the model's last
        message; a rollout that failed is left unanswered, which the studio records as abandoned."""
        session = self.sessions.pop(state["trajectory_id"], None)
        if session is None:
            return
        try:
            if "studio_reward" not in state and state.get("error") is None:
                completion = state.get("completion") or []
                answer = next((m.content for m in reversed(completion) if m.role == "assistant"), "")
                reply = await session.submit(answer=answer if isinstance(answer, str) else "",
                                             messages=plain([*state["prompt"], *completion]))
                state["studio_reward"], state["studio_outcome"] = reply.reward, reply.outcome
        finally:
            await session.close()


async def studio_reward(state: State) -> float:
    """The reward the studio's layered verifier gave the episode (0 where it could not grade it)."""
    reward = state.get("studio_reward")
    return float(reward) if reward is not None else 0.0


async def studio_scored(state: State) -> float:
    """1 where the studio graded the episode, 0 where it could not (an infrastructure error): logged only."""
    return 1.0 if state.get("studio_reward") is not None else 0.0


def plain(messages: Messages) -> list[dict]:
    """verifiers' messages as the chat messages the studio records (a tool call's arguments stay JSON text)."""
    return [m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m) for m in messages]


def load_environment(url: str = "http://127.0.0.1:8200", token: str | None = None, run: str | None = None,
                     model: str = "", examples: int = 64, seed: int = 0, template: str | None = None,
                     task: str | None = None, domain: str | None = None, max_turns: int = 16,
                     **kwargs) -> StudioEnv:
    """The studio's environment server at `url` as a verifiers environment. `token`: a project token with the
    environment scope (default: the STUDIO_TOKEN variable); `run`: the external run its episodes are recorded in
    (default: the token's name); `model`: what the run page calls the trained model; `examples` rows drawn from
    seeds `seed`, `seed + 1`, ... (or all of `template`'s, `task`'s or `domain`'s); `max_turns`: the model's turns
    per rollout."""
    chosen = {name: value for name, value in (("template", template), ("task", task), ("domain", domain)) if value}
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": STAND_IN}], "answer": "",
                               "info": {"seed": seed + index, **chosen}} for index in range(examples)])
    return StudioEnv(url=url, token=token or os.environ.get("STUDIO_TOKEN"), run=run, model=model, dataset=rows,
                     max_turns=max_turns, **kwargs)
