"""A reference check's attempt: a bundle's own reference answers through the real sandboxes and verifiers
(workers/rl/rollout/reference.py), archived as a run of kind `reference` and one step that the pages show and replay
like any other (a 3D answer with the views its verifier rendered). No model answers (its config, ReferenceCheckConfig,
has none) and nothing is trained. The run's events name every template whose references did not all pass. An
attempt that stops checks them again from the start.
"""

from __future__ import annotations

import time

from apps.common import wiring
from apps.registry.pins import bundle_tasks
from workers.rl.rollout.reference import OUTCOMES, check_references, reference_report, reference_tasks

from ..models import EventKind
from .base import Attempt


class ReferenceAttempt(Attempt):
    def execute(self) -> dict:
        """Verify `reference_per_template` (its config) reference answers of every template of the run's bundle
        and archive them as the run's one step. The summary: per template, references checked, passed, failed
        (graded below 1) and ungraded (the verifier could not decide), and the first that did not pass."""
        run, config = self.run, self.config
        tasks = bundle_tasks(bundle=run.bundle)
        chosen = reference_tasks(tasks, per_template=config.reference_per_template)
        if not chosen:
            raise ValueError(f"no task of {run.bundle.ref} has a reference answer to check")
        pool = self.closing(wiring.sandbox_pool())
        for template in tasks.templates.values():
            pool.warm(template.image)
        # Verified here, in this process's sandbox pool, even where training runs verify on Celery workers: a
        # command run from a shell should not wait on a queue that may have no worker yet.
        tool_runner, verifier = wiring.local_runners(pool, config)
        trajectories = check_references(str(run.pk), chosen, tool_runner=tool_runner, verifier=verifier,
                                        prices=wiring.prices(), concurrency=config.verify_concurrency)
        templates, points = reference_report(trajectories)
        events = [(EventKind.REFERENCE_FAILED,
                   f"{key}: {e['passed']}/{e['checked']} references passed, {e['failed']} failed, "
                   f"{e['ungraded']} could not be graded; {e['first_problem']['task']}: {e['first_problem']['why']}",
                   {"template": key, **e})
                  for key, e in templates.items() if e["first_problem"]]
        self.tracker.step(step=1, wall_time=time.time(), points=points, trajectories=trajectories, events=events)
        return {"run": str(run.pk), "outcome": "completed", "kind": "reference check",
                **{outcome: sum(e[outcome] for e in templates.values()) for outcome in OUTCOMES},
                "templates": templates}
