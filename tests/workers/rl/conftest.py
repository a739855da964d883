"""A small world for the engine's tests, no Django: a+b tasks, a numeric verifier, a tiny pretrained policy.

The policy is the project's own TinyLM, pretrained for a few seconds on the noisy a+b corpus: it writes numbers
and is right some of the time, so groups carry signal and GRPO has something to do — the same story as the
demo, small enough for a test.
"""

import copy

import pytest

from workers.definitions.specs import Limits, parse_spec
from workers.rl.config import GRPOConfig
from workers.rl.engines.torch_engine import TorchEngine
from workers.rl.models.base_model import pretrain
from workers.rl.models.chat_formats import CharChat
from workers.rl.models.policies import TinyLMPolicy
from workers.rl.protocols import Model
from workers.rl.rollout.grading import LocalVerifier
from workers.rl.session import build_pipeline
from workers.rl.tasks.taskset import TaskSet
from workers.rl.training.tracking import MemoryTracker
from workers.rl.types import TaskTemplate
from workers.sandbox import SandboxImage
from workers.verifiers import Item

RUN_ID = "00000000-0000-4000-8000-000000000001"
LIMIT = 10  # a, b below this
NUMERIC = parse_spec("verifier", {"layers": [
    {"name": "number", "kind": "exact", "checks": [{"type": "numeric", "name": "answer", "reference": "{answer}",
                                                    "abs_tolerance": 0, "rel_tolerance": 0}]}]})
PLAIN_PYTHON = SandboxImage(key="sandbox_image/plain-python@1", layers=({"type": "base", "image": "python-3.11"},),
                            warm_pool_size=2)


def addition_template(**limits) -> TaskTemplate:
    return TaskTemplate(key="task_template/add@1", domain="arithmetic", system_prompt="", prompt_template="{a}+{b}=",
                        tools=(), limits=Limits(**{"max_turns": 1, "max_tokens": 4, "max_seconds": 10, **limits}),
                        image=PLAIN_PYTHON, verifier_key="verifier/numeric@1", verifier_spec=NUMERIC)


ITEMS = {f"add-{a}-{b}": Item(key=f"add-{a}-{b}", inputs={"a": a, "b": b}, hidden={"answer": a + b})
         for a in range(LIMIT) for b in range(LIMIT)}


@pytest.fixture(scope="session")
def addition_base_model():
    """A TinyLM that knows the a+b format and is unreliable about the sums (about 10 s on two cores)."""
    corpus = [(f"{item.inputs['a']}+{item.inputs['b']}=",
               [{"role": "assistant", "content": str(item.hidden['answer'])}]) for item in ITEMS.values()]
    model, _ = pretrain(corpus, steps=100, seed=0, block_size=64, wrong_fraction=0.0)
    return model


@pytest.fixture
def make_pipeline(addition_base_model, tmp_path):
    """make_pipeline(steps, checkpoint_dir=..., **config) -> (pipeline, tracker), each from the same base weights.
    A sync run's engine samples from the trainer's own model, as models/build.py makes it (`share` says
    otherwise)."""

    def make(steps: int, *, checkpoint_dir=None, tracker=None, share: bool | None = None, **overrides):
        config = GRPOConfig.resolve({"groups_per_step": 4, "group_size": 6, "micro_batch_size": 32,
                                                        "learning_rate": 3e-3, "eval_tasks_per_domain": 0,
                                                        "checkpoint_every": 2, **overrides})
        policy = TinyLMPolicy(copy.deepcopy(addition_base_model))
        engine = TorchEngine(policy.model, share=config.mode == "sync" if share is None else share)
        tracker = tracker or MemoryTracker()
        pipeline = build_pipeline(
            run_id=RUN_ID, config=config, total_steps=steps, tasks=TaskSet.single_template(addition_template(), ITEMS),
            model=Model(policy=policy, engine=engine, chat=CharChat()), tool_runner=None,
            verifier=LocalVerifier(pool=None), tracker=tracker, checkpoint_dir=checkpoint_dir or tmp_path / "ckpt")
        return pipeline, tracker

    return make
