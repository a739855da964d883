"""Two rollouts of the studio's verl agent loop (workers/environments/clients/verl_agent_loop.py) as verl's own
AgentLoopWorker runs them, in verl's environment (verl 0.9 pins transformers<5.11: not the studio's), against an
environment server: test_verl_agent_loop.py runs this program with that environment's python.

verl's own pieces throughout: its generated trainer config, the agent loop registry loaded from a YAML file as
the worker loads `agent_loop_config_path`, hydra's instantiate with the worker's arguments, ToolAgentLoop's state
machine, its hermes tool parser and Continuous Token bookkeeping, and AgentLoopOutput's conversion to tensors. The
one stand-in is the LLM server (vLLM or SGLang on a GPU in a real run): a scripted `generate` that answers token
ids, as TRL's tests replace `model.generate`. Of one group (one seed: one task), the first rollout checks the sum
with run_python and submits it, the second checks it and answers one less in a message.

usage: python verl_rollouts.py URL TOKEN RUN MODEL_DIR OUT.json
"""

import asyncio
import json
import re
import sys
import tempfile
from pathlib import Path

import hydra
import verl
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the studio's checkout: its clients, nothing else


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call><|im_end|>"


class ScriptedServer:
    """verl's LLM server client, scripted: what each rollout (its request id) writes next."""

    def __init__(self, tokenizer):
        self.tokenizer, self.rollouts = tokenizer, {}

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_) -> TokenOutput:
        rollout = self.rollouts.setdefault(request_id, len(self.rollouts))
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1])
        results = text.count("<tool_response>")
        if results == 0:
            script = call("run_python", code=f"print({a} + {b})")
        elif rollout == 0:
            script = call("submit", answer=str(a + b))
        else:
            script = f"It is {a + b - 1}.<|im_end|>"
        ids = self.tokenizer(script, add_special_tokens=False)["input_ids"]
        return TokenOutput(token_ids=ids, stop_reason="completed")


async def main(url: str, token: str, run: str, model_dir: str, out: str) -> None:
    config = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    rollout = config.actor_rollout_ref.rollout
    rollout.prompt_length, rollout.response_length = 1024, 512
    rollout.multi_turn.update(enable=True, max_assistant_turns=4, format="hermes")
    loops = Path(tempfile.mkdtemp()) / "agent_loop.yaml"  # the README's recipe, as the worker loads it
    loops.write_text(f"- name: studio_agent\n  _target_: workers.environments.clients.verl_agent_loop.StudioAgentLoop"
                     f"\n  url: {url}\n  token: {token}\n  run: {run}\n  model: tiny-llama\n")
    [loop_config] = OmegaConf.load(loops)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    server = ScriptedServer(tokenizer)

    async def rollout_one(index: int) -> dict:
        loop = hydra.utils.instantiate(config=loop_config, trainer_config=DictConfigWrap(config=config),
                                       server_manager=server, tokenizer=tokenizer, processor=None,
                                       hf_model_type="llama", dataset_cls=RLHFDataset,
                                       data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))
        output = await loop.run({"temperature": 1.0, "top_p": 1.0}, index=index, agent_name="studio_agent",
                                raw_prompt=[{"role": "user", "content": "(the studio's task)"}],
                                extra_info={"seed": 0}, tools_kwargs={}, data_source="posttrain-studio")
        tensors = output.as_dict()
        mask = output.response_mask
        return {"reward_score": output.reward_score, "rm_score_last": float(tensors["rm_scores"][-1]),
                "rm_score_sum": float(tensors["rm_scores"].sum()), "extra_fields": output.extra_fields,
                "num_turns": output.num_turns, "response": tokenizer.decode(output.response_ids),
                "trained_tokens": sum(mask), "masked_tokens": len(mask) - sum(mask), "loop": type(loop).__name__}

    results = [await rollout_one(0), await rollout_one(1)]
    Path(out).write_text(json.dumps(results, default=str))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
