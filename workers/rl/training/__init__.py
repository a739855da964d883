"""The update: GRPO, the trainer, checkpoints, data-parallel training, and where a run reports."""
