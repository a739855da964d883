"""`manage.py bench AREA [--json]`: speed and memory figures, measured in one run, printed as JSON.

Targets live here, not in timed tests. Each area is a module in apps.benchmarks exposing run(**options) -> dict.
"""

import importlib
import json

from django.core.management.base import BaseCommand

AREAS = {"registry": "apps.benchmarks.registry", "sandbox": "apps.benchmarks.sandbox",
         "verify": "apps.benchmarks.verify", "ui": "apps.benchmarks.ui", "pipeline": "apps.benchmarks.pipeline",
         "trainer": "apps.benchmarks.trainer"}


class Command(BaseCommand):
    help = "Run a benchmark area and print its figures."

    def add_arguments(self, parser):
        parser.add_argument("area", choices=sorted(AREAS))
        parser.add_argument("--json", action="store_true", help="print one JSON object (the default output too)")
        parser.add_argument("--instances", type=int, default=20_000, help="registry: task instances per template")
        parser.add_argument("--samples", type=int, default=100, help="sandbox: warm runs to time")
        parser.add_argument("--backend", help="sandbox: process or docker (default: settings.SANDBOX_BACKEND)")
        parser.add_argument("--trajectories", type=int, default=1_000_000, help="ui: rows generated for the list")
        parser.add_argument("--streams", type=int, default=10, help="ui: runs streaming to open run pages at once")
        parser.add_argument("--stream-steps", type=int, default=30, help="ui: measured steps each streaming run writes")
        parser.add_argument("--warmup-steps", type=int, default=5,
                            help="ui: steps each streaming run writes first, not measured (pages warming up)")
        parser.add_argument("--step-seconds", type=float, default=1.0, help="ui: seconds between a run's steps")
        parser.add_argument("--skip-push", action="store_true", help="ui: only the trajectory list")
        parser.add_argument("--skip-list", action="store_true", help="ui: only the push latency")
        parser.add_argument("--steps", type=int, help="pipeline, trainer: trainer steps per side")
        parser.add_argument("--environment-scale", type=float, default=0.1,
                            help="pipeline: the shortest environment time in seconds (the Pareto minimum)")
        parser.add_argument("--target-reward", type=float, default=0.6,
                            help="trainer: the reward moving average both trainers race to")
        parser.add_argument("--pretrain-steps", type=int, default=1500, help="trainer: steps teaching the base model")

    def handle(self, *args, area, **options):
        if options["steps"] is None:
            options.pop("steps")
        result = importlib.import_module(AREAS[area]).run(**options)
        self.stdout.write(json.dumps(result, indent=None if options["json"] else 2))
