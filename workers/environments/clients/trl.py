"""The studio's environments for TRL's GRPOTrainer: `environment_factory=studio_environment(...)`, the verdict as the
reward through `studio_reward`, and every episode recorded in the studio as a trajectory of the trainer's run.

    from trl import GRPOConfig, GRPOTrainer
    from workers.environments.clients.trl import studio_dataset, studio_environment, studio_reward

    environment = studio_environment("http://127.0.0.1:8200", token=TOKEN, run="qwen-grpo-1", model="Qwen3-0.6B")
    trainer = GRPOTrainer(model=..., args=GRPOConfig(num_generations=8, ...), train_dataset=studio_dataset(512),
                          reward_funcs=studio_reward, environment_factory=environment)

How TRL uses it (trl/trainer/grpo_trainer.py, 1.16):
- TRL makes one instance per rollout and reads the class's public methods as the model's tools (their type hints
  and Google-style docstrings become the function schemas in the prompt). So `studio_environment` asks the server
  for the template's tools first (the stateless `/reset`: nothing is held or recorded) and returns a class with one
  method per tool;
- before each rollout TRL calls `reset(**row)`: a new episode on the instance's own WebSocket session. The row's
  `seed` draws the task as a run draws it, so the group of rollouts TRL makes from one row plays one task, as GRPO
  needs; `template`, `task` and `domain` in a row name one. The prompt comes back as the text TRL appends to the
  row's (empty) user message: TRL can only extend the last user message, so a system prompt comes first in it;
- the model's calls run in the studio's sandbox as they come, except `submit`, which is kept until the rollout is
  over: `studio_reward` then submits it with the turns the model wrote (TRL's completion), so the studio records
  what the model wrote with the server's own tool results, and grades it. A rollout that ends on a message without
  submitting is graded on that message, as the studio's own rollouts are;
- the episode is recorded at the trainer's step (TRL's `global_step` + 1, the optimizer step it is generated for),
  so the run page's reward curve is by the trainer's step and a group's episodes share it.

A bundle whose templates offer different tools: one class per template in a dict (`{ref:
studio_environment(..., template=ref)}`) and an `environment` column in the dataset naming each row's, as TRL's
multi-environment mode takes it.
"""

from __future__ import annotations

import inspect
import json
import keyword
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .session import SUBMIT, EnvironmentSession, EpisodeRefused, Opening, function_schema, server_url

RESERVED = ("reset", "get_reward")  # TRL's names for the environment's own methods, never tools
JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict, "array": list}
CHOICE = ("seed", "domain", "template", "task")  # what a dataset row may say of its task


class StudioEnvironment:
    """One rollout's environment: TRL makes one per rollout and resets it for each. The subclass that
    `studio_environment` makes adds one method per tool of the served template."""

    url = ""
    token: str | None = None
    run: str | None = None
    model = ""
    default_choice: dict[str, str] = {}
    tool_names: frozenset[str] = frozenset()
    _trainer_state = None  # TRL's TrainerState, from the reward function's first call: its global_step is live

    def __init__(self):
        self._session = None  # openenv's SyncEnvClient around an EnvironmentSession, opened at the first reset
        self.opening: Opening | None = None
        self.submitted: dict | None = None  # the submit call, kept until the rollout is over
        self.ended = None  # the Reply that ended the episode (a budget spent mid-rollout, or the submit)
        self.tool_calls = 0

    def reset(self, **row) -> str | None:
        """A new episode for the rollout `row` (a dataset row: its `seed`, `template`, `task`, `domain` choose the
        task). Returns the prompt as the text TRL adds to the row's user message (None when the row has a prompt
        of its own)."""
        if self._session is None:
            self._session = EnvironmentSession(self.url, token=self.token, run=self.run, model=self.model,
                                               client="trl").sync()
            self._session.connect()
        choice = {**self.default_choice, **{name: row[name] for name in CHOICE if row.get(name) is not None}}
        state = type(self)._trainer_state
        self.opening = self._session.open_episode(**choice, trainer_step=(state.global_step + 1) if state else 1)
        self.submitted, self.ended, self.tool_calls = None, None, 0
        unknown = {tool["name"] for tool in self.opening.tools} - self.tool_names
        if unknown:
            raise EpisodeRefused(
                f"task {self.opening.task} of {self.opening.template} offers {', '.join(sorted(unknown))}, which this "
                f"environment class does not have (it has {', '.join(sorted(self.tool_names))}): make one class per "
                "template, studio_environment(..., template=...), and route rows to them by an `environment` column")
        prompt = row.get("prompt")
        if isinstance(prompt, list) and prompt and prompt[-1].get("content"):
            return None
        return prompt_text(self.opening.messages)

    def _use(self, name: str, arguments: dict[str, Any]) -> str:
        """A tool method's body: the call in the studio's sandbox, its text for the model. Raised errors are what
        TRL shows the model as the call's error (and counts as failed calls)."""
        if self.opening is None:
            raise RuntimeError("reset the environment before its tools are called")
        if self.ended is not None or self.submitted is not None:
            raise RuntimeError("the episode is over" + (": you submitted" if self.submitted is not None else
                                                        f" ({self.ended.text})") + "; give your final answer")
        self.tool_calls += 1
        if name == SUBMIT:
            self.submitted = arguments
            return "submitted"
        reply = self._session.call(name, arguments)
        if reply.done:
            self.ended = reply
        return reply.text

    def _conclude(self, completion: list[dict] | str) -> tuple[float | None, str]:
        """After the rollout: submits (what the model submitted, or its final message) with the turns it wrote,
        and returns the studio's reward (None: not scored, an infrastructure error) and the episode's id."""
        if self.opening is None:
            return None, ""
        messages = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
        if self.ended is not None:  # ended mid-rollout (its tool budget spent): graded then, as it stood
            return self.ended.reward, self.opening.episode_id
        answer = (self.submitted or {}).get("answer")
        if answer is None:
            answer = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        self.ended = self._session.submit(answer=str(answer), messages=messages)
        return self.ended.reward, self.opening.episode_id

    def _close(self) -> None:
        """Closes the session (private: TRL would offer a public method to the model as a tool). A session left
        open closes with the process; the server then records an unfinished episode as abandoned."""
        if self._session is not None:
            self._session.close()
            self._session = None


def studio_environment(url: str, *, token: str | None = None, run: str | None = None, model: str = "",
                       template: str | None = None, domain: str | None = None) -> type[StudioEnvironment]:
    """The environment class for `GRPOTrainer(environment_factory=...)`: its tools are the served template's
    (`template`; else the one a draw from the bundle's mix, or from `domain`, gives). `run`: the external run the
    episodes are recorded in (default: the token's name); `model`: what the run page calls the trained model."""
    import httpx

    choice = {name: value for name, value in (("template", template), ("domain", domain)) if value is not None}
    # The stateless /reset of OpenEnv's HTTP routes: the task's prompt and tools, and nothing held or recorded.
    response = httpx.post(server_url(url, token).rstrip("/") + "/reset", json={"seed": 0, **choice}, timeout=60)
    if response.status_code != 200:
        raise EpisodeRefused(f"{url}/reset answered {response.status_code}: {response.text[:500]}")
    tools = [function_schema(tool) for tool in response.json()["observation"]["tool_schemas"]]
    methods = {tool["name"]: tool_method(tool) for tool in tools}
    return type("StudioEnvironment", (StudioEnvironment,), {
        "url": url, "token": token, "run": run, "model": model, "default_choice": choice,
        "tool_names": frozenset(methods), "__doc__": StudioEnvironment.__doc__, **methods})


def studio_reward(completions, environments=None, trainer_state=None, log_extra=None, **_) -> list[float | None]:
    """TRL's reward function for studio environments: each rollout's episode submitted with the turns its model
    wrote, graded by the studio's layered verifier; that reward (None for another environment's rollout, or an
    episode the studio could not grade). The episodes are graded at once, each on its own session."""
    environments = environments or []
    ours = [(index, env) for index, env in enumerate(environments) if isinstance(env, StudioEnvironment)]
    for _, env in ours:
        type(env)._trainer_state = trainer_state  # the next resets read the trainer's step from it
    rewards: list[float | None] = [None] * len(completions)
    episodes = [""] * len(completions)
    if ours:
        with ThreadPoolExecutor(max_workers=min(len(ours), 64), thread_name_prefix="studio-submit") as pool:
            outcomes = pool.map(lambda pair: pair[1]._conclude(completions[pair[0]]), ours)
            for (index, _), (reward, episode) in zip(ours, outcomes, strict=True):
                rewards[index], episodes[index] = reward, episode
    if log_extra is not None:
        log_extra("studio_episode", episodes)  # the trajectory's id in the studio, beside TRL's completion
    return rewards


def studio_dataset(rows: int, *, seed: int = 0, **choice):
    """A dataset of `rows` rows for GRPOTrainer with studio environments: each row a seed (seed, seed + 1, ...),
    which draws its task, and an empty user message that the environment's reset fills with the task's prompt;
    `template`, `task`, `domain` are put in every row."""
    from datasets import Dataset

    unknown = set(choice) - set(CHOICE)
    if unknown:
        raise TypeError(f"studio_dataset takes {', '.join(CHOICE[1:])}; not {', '.join(sorted(unknown))}")
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * rows,
                              "seed": list(range(seed, seed + rows)),
                              **{name: [value] * rows for name, value in choice.items()}})


def prompt_text(messages: list[dict]) -> str:
    """The prompt as one user message's text: TRL adds reset's answer to the last user message, so a system prompt
    and examples come first, each apart."""
    return "\n\n".join(str(m.get("content") or "") for m in messages)


def tool_method(tool: dict):
    """A method for `tool` (a function schema) as TRL reads tools: a signature with type hints and a Google-style
    docstring, from which transformers rebuilds the schema for the chat template; its body is the call in the
    studio. The arguments the model gives are passed on as they are: the server checks them as the studio checks
    its own policy's calls."""
    name = tool["name"]
    if name in RESERVED or name.startswith("_") or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"the tool {name!r} cannot be a TRL environment's method ({', '.join(RESERVED)}, private "
                         "names and Python keywords are taken)")
    parameters = tool["parameters"].get("properties") or {}
    required = set(tool["parameters"].get("required") or [])
    for parameter in parameters:
        if not parameter.isidentifier() or keyword.iskeyword(parameter) or parameter == "self":
            raise ValueError(f"the tool {name}'s parameter {parameter!r} cannot be a Python parameter name")
    ordered = sorted(parameters, key=lambda p: p not in required)  # required ones first, as Python needs
    signature = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=python_type(parameters[p]),
                             default=inspect.Parameter.empty if p in required else None) for p in ordered],
        return_annotation=str)

    def method(self, **arguments):
        return self._use(name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__signature__ = signature
    method.__annotations__ = {**{p: python_type(parameters[p]) for p in ordered}, "return": str}
    lines = [_one_line(tool.get("description") or name), ""] + (["Args:"] if ordered else [])
    for p in ordered:
        text = _one_line(parameters[p].get("description") or p)
        if parameters[p].get("enum"):
            text += f" (choices: {json.dumps(parameters[p]['enum'])})"
        lines.append(f"    {p}: {text}")
    method.__doc__ = "\n".join(lines + ["", "Returns:", "    What the tool answered, as the model reads it."])
    return method


def python_type(schema: dict):
    """The type hint transformers turns back into `schema`'s JSON type (a list's item type kept when plain)."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "array":
        item = JSON_TYPES.get((schema.get("items") or {}).get("type"))
        return list[item] if item in (str, int, float, bool) else list
    return JSON_TYPES.get(kind, str)


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", str(text)).strip()
