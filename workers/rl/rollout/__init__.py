"""Rollouts: the agent loop and its tools, grading, the collectors that keep rollouts going, evaluation and the
reference check, and the run's metrics (with where the trainer's idle time goes)."""
