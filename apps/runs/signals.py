"""What the runs app announces to the apps above it, so that it imports none of them: they connect receivers
in their AppConfig.ready, as evals reacts to a checkpoint's post_save.

`trajectories_archived` (run=, trajectory_ids= in the order the step archived them) is sent once a trainer
step's transaction has committed, never inside it: a receiver's work, its locks (a review queue's row) and its
failures stay out of the trainer's step, which is then already in the archive. What a receiver misses if the
process dies between the commit and the signal is one step's reaction — acceptable for what reacts today (a
review queue's sampled share of a run); a reaction that must never be missed belongs in the step's services.
"""

from django.dispatch import Signal

trajectories_archived = Signal()
