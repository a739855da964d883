"""Clients for the field's trainers: each plays the studio's environments through `manage.py environments serve`
(apps/environments/server.py) with OpenEnv's own client, so every episode the trainer plays is recorded in the
studio as a trajectory of its external run.

- session.py: one WebSocket session on the server, the connection the three clients below play through;
- trl.py: an environment class for TRL's `GRPOTrainer(environment_factory=...)` and the reward function that
  reports the verdict;
- verifiers_env.py: `load_environment(...)` for verifiers (prime-rl, SkyRL, Tinker and the others that load
  environments through it);
- verl_agent_loop.py: an agent loop registered for verl's `AgentLoop` interface.

Django-free and light: a trainer's machine needs openenv-core and its own trainer's library, not the studio's
dependencies. Each module imports its trainer's library itself, so importing one never needs the others'.
"""
