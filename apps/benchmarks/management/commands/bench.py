"""`manage.py bench AREA [--json]`: speed and memory figures, measured in one run, printed as JSON.

Targets live here, not in timed tests. Each area is a module in apps.benchmarks exposing run(**options) -> dict.
"""

import importlib
import json

from django.core.management.base import BaseCommand

AREAS = {"registry": "apps.benchmarks.registry", "sandbox": "apps.benchmarks.sandbox",
         "verify": "apps.benchmarks.verify"}


class Command(BaseCommand):
    help = "Run a benchmark area and print its figures."

    def add_arguments(self, parser):
        parser.add_argument("area", choices=sorted(AREAS))
        parser.add_argument("--json", action="store_true", help="print one JSON object (the default output too)")
        parser.add_argument("--instances", type=int, default=20_000, help="registry: task instances per template")
        parser.add_argument("--samples", type=int, default=100, help="sandbox: warm runs to time")
        parser.add_argument("--backend", help="sandbox: process or docker (default: settings.SANDBOX_BACKEND)")

    def handle(self, *args, area, **options):
        result = importlib.import_module(AREAS[area]).run(**options)
        self.stdout.write(json.dumps(result, indent=None if options["json"] else 2))
