"""The studio's environments for verl (0.9): an agent loop registered for verl's `AgentLoop` interface as
`studio_agent`, each rollout a studio episode, its reward the studio's verdict, every episode recorded in the studio
as a trajectory of the trainer's run.

verl pins transformers<5.11 and Ray, so it has an environment of its own, apart from the studio's: this module
needs only verl, openenv-core and the studio's checkout on the path (it imports nothing else of the studio).

    # agent_loop.yaml (actor_rollout_ref.rollout.agent.agent_loop_config_path=agent_loop.yaml)
    - name: studio_agent
      _target_: workers.environments.clients.verl_agent_loop.StudioAgentLoop
      url: http://127.0.0.1:8200      # the token: STUDIO_TOKEN in the rollout workers' environment
      run: verl-qwen-grpo
      model: Qwen3-4B

and a dataset whose rows name the loop (`agent_name: studio_agent`) and carry the task's choice in `extra_info`
(`seed`, or `template`, `task`, `domain`): `studio_rows(...)` writes one. What the loop does, in verl's terms:
- it is verl's ToolAgentLoop (its state machine, its tool parser, its token bookkeeping: the model's tokens trained
  on, the tool results masked) with the episode's prompt and tools in place of the row's: a reset of the studio's
  episode on a session of the rollout's own gives both;
- each tool is a verl BaseTool whose execute is the studio session call (run in the studio's sandbox); `submit`
  ends the episode with the conversation as its turns, and the loop stops there. A rollout that ends on a message
  (or on verl's turn and length limits) is graded on that message, as the studio grades its own rollouts;
- the studio's reward is the rollout's `reward_score`, which verl takes as its reward (`rm_scores`) in place of a
  reward function's; `extra_fields` carry the episode's id and whether the studio scored it.
verl tells an agent loop no trainer step, so the studio records these episodes in the order they end.
"""

from __future__ import annotations

import os
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentState, ToolAgentLoop
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from .session import SUBMIT, EnvironmentSession, Reply

CHOICE = ("seed", "domain", "template", "task")


class StudioTool(BaseTool):
    """One of the episode's tools: its execute is the call in the studio (submit: with the conversation)."""

    def __init__(self, schema: dict, loop: StudioAgentLoop):
        # BaseTool's own __init__ prints the schema: once per tool per rollout here, so its three fields are set
        # directly instead.
        self.config, self.loop, self.name = {}, loop, schema["name"]
        parameters = schema.get("parameters") or {}
        self.tool_schema = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {
            "name": self.name, "description": schema.get("description") or self.name,
            "parameters": {"type": "object", "required": parameters.get("required") or [], "properties": {
                name: {"type": spec.get("type", "string"), "description": spec.get("description"),
                       "enum": spec.get("enum")}
                for name, spec in (parameters.get("properties") or {}).items()}}}})

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        if self.name == SUBMIT:
            reply = await self.loop.submit(parameters.get("answer"))
        else:
            reply = await self.loop.session.call(self.name, parameters)
        if reply.done:
            self.loop.ending = reply
        return ToolResponse(text=reply.text), 0.0, {}


@register("studio_agent")
class StudioAgentLoop(ToolAgentLoop):
    """verl's ToolAgentLoop on a studio episode: one instance per rollout, as verl makes them."""

    def __init__(self, *args, url: str = "http://127.0.0.1:8200", token: str | None = None, run: str | None = None,
                 model: str = "", **kwargs):
        kwargs.pop("tools", None)  # verl's configured tools: the episode's own take their place
        super().__init__(*args, tools=None, **kwargs)
        self.connection = {"url": url, "token": token or os.environ.get("STUDIO_TOKEN"), "run": run, "model": model}
        self.session: EnvironmentSession | None = None
        self.agent_data = None  # the rollout's AgentData: its messages are what the episode's turns are reported as
        self.ending: Reply | None = None

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        extra = kwargs.get("extra_info") or {}
        self.session = EnvironmentSession(**self.connection, client="verl")
        try:
            opening = await self.session.open_episode(**{k: extra[k] for k in CHOICE if extra.get(k) is not None})
            tools = [StudioTool(schema, self) for schema in opening.tools]
            self.tools = {tool.name: tool for tool in tools}
            self.tool_schemas = [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in tools]
            output = await super().run(sampling_params, **{**kwargs, "raw_prompt": opening.messages})
            if self.ending is None:  # ended on a message or a verl limit: graded on the model's last message
                messages = self.agent_data.messages
                last = messages[-1] if messages and messages[-1]["role"] == "assistant" else {}
                self.ending = await self.submit(str(last.get("content") or ""))
        finally:
            await self.session.close()  # an episode left unanswered (an error above) is recorded as abandoned
        reward = self.ending.reward
        output.reward_score = float(reward) if reward is not None else 0.0
        output.extra_fields.update({"studio_episode": opening.episode_id, "studio_scored": reward is not None})
        return output

    async def submit(self, answer: str | None) -> Reply:
        """Ends the episode with `answer` and the conversation as the episode's turns. verl's tool parser keeps the
        special tokens the model wrote (an end of turn) in a message's text: they are markup, not what the model
        said, and an exact check of the answer would fail on them, so they are taken out."""
        markup = [token for token in getattr(self.tokenizer, "all_special_tokens", []) if token]

        def said(text):
            if not isinstance(text, str):
                return text
            for token in markup:
                text = text.replace(token, "")
            return text.strip()

        messages = [{**m, "content": said(m.get("content"))} if m.get("role") == "assistant" else m
                    for m in self.agent_data.messages]
        return await self.session.submit(answer=said(answer), messages=messages)

    async def _handle_pending_state(self, agent_data, sampling_params):
        self.agent_data = agent_data
        return await super()._handle_pending_state(agent_data, sampling_params)

    async def _handle_processing_tools_state(self, agent_data):
        state = await super()._handle_processing_tools_state(agent_data)
        return AgentState.TERMINATED if self.ending is not None else state  # submitted: the episode is over


def studio_rows(path: str, rows: int, *, seed: int = 0, **choice) -> str:
    """A parquet dataset of `rows` rows for verl (data.train_files): each row the studio_agent loop and a seed
    (seed, seed + 1, ...), which draws its task; `template`, `task`, `domain` are put in every row. The prompt is a
    stand-in that the episode's replaces."""
    import pandas

    unknown = set(choice) - set(CHOICE)
    if unknown:
        raise TypeError(f"studio_rows takes {', '.join(CHOICE[1:])}; not {', '.join(sorted(unknown))}")
    pandas.DataFrame([{"prompt": [{"role": "user", "content": "(the studio's task, drawn at the rollout)"}],
                       "agent_name": "studio_agent", "data_source": "posttrain-studio",
                       "extra_info": {"seed": seed + index, **choice}} for index in range(rows)]).to_parquet(path)
    return path
