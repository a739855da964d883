"""The learning half: draw tasks, roll them out with the policy (tools in the sandbox pool), grade them, train
on them with GRPO, report what happened. No Django here.

Read in this order — the top, then the folders:
- config.py (a run's settings) and types.py (what flows through: templates, tasks, trajectories);
- session.py (how a training session is put together) → pipeline.py (the loop);
- rollout/: collectors.py (async and sync collection, bounded staleness) → agent.py (one rollout, its tools) →
  grading.py; evaluation and the reference check; the run's metrics;
- training/: trainer.py + grpo.py (the update), checkpoints, data-parallel training, where a run reports;
- tasks/: the task set and the scheduler that draws from it;
- models/: the tiny LM, the policies the trainer updates, chat formats, packaged and base models, and
  build.py, which makes a run's model from its config;
- engines/: inference engines (generate, load weights); serving/: the OpenAI-compatible servers over them.
The layers between them are import contracts (pyproject.toml, `make lint`). The engine's benchmarks live apart, in
the top-level benchmarks/engine/ (`manage.py bench`), not installed with it."""
