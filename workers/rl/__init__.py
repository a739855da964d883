"""The learning half: draw tasks, roll them out with the policy (tools in the sandbox pool), grade them, train
on them with GRPO, report what happened. No Django here.

Read in this order: session.py (how a training session is put together) → pipeline.py (the loop) →
collectors.py (async and sync collection, bounded staleness) → agent.py (one rollout) → grading.py →
trainer.py + grpo.py (the update). Types that flow through it: types.py; where it reports: tracking.py."""
