"""The hundred-domain demo (`make demo DOMAINS=reasoning-gym`): reasoning-gym's datasets as domains of the demo
project, beside the six-domain demo, and two bundles over them sized for the demo's two models.

`tasks from-generator reasoning-gym` publishes a domain per dataset that passes its reference check (about ninety
of 0.1.25's hundred and six), twenty generated tasks each, in bundle `reasoning-gym`; the demo bundles include it:
- `demo-reasoning-gym`: the tiny character model (its context 512 characters: a rollout keeps the tail of a longer
  prompt, where the question ends and the answer format is asked for; its 64 sampled characters hold a short
  <answer>...</answer>);
- `demo-reasoning-gym-smollm`: SmolLM2-135M-Instruct with the real-model demo's LoRA settings (smollm.py), its
  context held to 512 tokens (a question's tail) so that the longest questions (rectangle_count's drawings,
  codeio's programs) cost a CPU step and its memory no more than a short one, 64 tokens to answer in.
Most of these tasks are beyond both models: the curriculum (GRPOConfig.curriculum) draws the tasks a model always
or never solves a tenth as often, so the steps go to the domains where its rewards vary. The evaluation at a run's
start and end takes a few tasks of each domain, not the 64 a six-domain run takes.

What was measured on 2 CPU cores (reasoning-gym 0.1.25, 89 domains):
- the tiny model: a 3-step run took 58 s; its pretraining on the references taught it the tags' shape, not the
  tags (85 of 768 rollouts closed one, 46 opened one), and no rollout scored: no group had a signal to learn from;
- SmolLM2 from its base weights: 2 steps in 495 s, no rollout wrote <answer> tags (0 of 256) and none scored;
- SmolLM2 after `cold_start --bundle demo-reasoning-gym-smollm` (SFT on the 267 references of the reference check,
  3 a template, 9 steps, 4.6 minutes): 3 steps in 439 s, 280 of 288 rollouts in the tags, 26 scored above 0 (course
  schedules, number sequences, time intervals, binary alternation, rectangle counts), 80 in groups with a signal.
  `make demo DOMAINS=reasoning-gym MODEL=smollm` runs that cold start first (Makefile).
"""

from django.core.management import call_command

from apps.registry.services import version_publish

from . import smollm
from .draft import Draft

LIBRARY = "reasoning-gym"
SIZE = 20
MAX_TOKENS = 64
# SmolLM2's context here: the engine samples a run's evaluation in one batch, whose cache grows with its rows'
# context (at 1,024 tokens, 178 rows held 9 GB); a question's tail fits in 512.
CONTEXT_TOKENS = 512
GENERATED_BUNDLE = "reasoning-gym"
BUNDLES = {
    "demo-reasoning-gym": Draft("bundle", "demo-reasoning-gym", "reasoning-gym's datasets, a domain each, for the "
                                "tiny demo model.", {
                                    "members": [f"bundle/{GENERATED_BUNDLE}@latest"],
                                    "run_config": {"model": "model/demo-tiny", "eval_tasks_per_domain": 4}}),
    "demo-reasoning-gym-smollm": Draft("bundle", "demo-reasoning-gym-smollm", "reasoning-gym's datasets, a domain "
                                       "each, for SmolLM2-135M-Instruct (LoRA GRPO on the CPU).", {
                                           "members": [f"bundle/{GENERATED_BUNDLE}@latest"],
                                           "run_config": {**smollm.RUN_CONFIG, "eval_tasks_per_domain": 1,
                                                          "context_length": CONTEXT_TOKENS}}),
}


def seed_generated(*, project, user, stdout) -> list:
    """Publish reasoning-gym's domains into `project` (idempotent, as the demo seed is) and the demo bundles over
    them; returns the bundles' versions."""
    call_command("tasks", "from-generator", LIBRARY, "--project", project.slug, "--size", str(SIZE),
                 "--max-tokens", str(MAX_TOKENS), "--bundle", GENERATED_BUNDLE, "--user", user.username,
                 stdout=stdout)
    return [version_publish(project=project, kind=draft.kind, slug=draft.slug, spec=draft.spec, author=user,
                            message="demo seed", description=draft.description, via="cli").version
            for draft in BUNDLES.values()]
