"""torchrun's entry point for a data-parallel attempt the studio already claimed (attempts/training.py starts it):

    python -m torch.distributed.run --standalone --nproc-per-node N --module apps.runs.ranks RUN:ATTEMPT ENDING

Rank 0 runs the attempt as a worker's process would (workers/rl/training/distributed.py leads the others through each
step) and writes how it ended to ENDING (JSON), where the waiting worker reads it: the run's summary, or, for an
attempt that stopped without a verdict, "taken over" or "left to resume" (attempts.Unfinished). Either way rank 0
releases the other ranks and exits 0: it ended as the attempt decided, and torchrun would report any other status
as its own 1, the same for every cause. The other ranks compute gradients on their shard and sample rollouts for
rank 0. It sits beside the attempts package, not in it: torchrun imports the module before Django is set up, and the
package imports the models.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 2 or ":" not in argv[0]:
        print(__doc__, file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
    import django

    django.setup()
    from workers.rl.training import distributed

    from .attempts import Unfinished, run_attempt

    run_id, _, attempt = argv[0].partition(":")
    ending_path = Path(argv[1])
    topology = distributed.setup()
    try:
        if not topology.leader:  # no database, no archive, no checkpoints: gradients and rollouts for rank 0
            updates = distributed.follow()
            print(f"rank {topology.rank}: took part in {updates} updates", file=sys.stderr)
            return 0
        with distributed.leading():
            ending = run_attempt(run_id=run_id, attempt=int(attempt))
        if isinstance(ending, Unfinished):
            print(f"run {run_id} attempt {attempt}: {ending}", file=sys.stderr)
        written = ending_path.with_suffix(".partial")
        written.write_text(json.dumps(ending, default=str))
        written.replace(ending_path)  # the waiting worker never reads half of it
        return 0
    finally:
        distributed.teardown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
