"""`manage.py bench AREA [--json]`: speed and memory figures, measured in one run, printed as JSON.

Targets live in the benchmarks, not in timed tests. Each area is a module of the top-level `benchmarks` package
exposing run(**options) -> dict: benchmarks/studio/ when it needs the studio (Django, the database), benchmarks/
engine/ when it measures the engine alone (Django-free). They are not installed with the web app (pyproject.toml
installs studio, apps and workers only) and nothing of the studio imports them (a contract of `make lint`): this
command imports an area by its module's name when asked, from a checkout, or from an image that copies them.
"""

import importlib
import json

from django.core.management.base import BaseCommand, CommandError

from apps.common import wiring

AREAS = {"registry": "benchmarks.studio.registry", "verify": "benchmarks.studio.verify",
         "ui": "benchmarks.studio.ui", "review": "benchmarks.studio.review",
         "evals": "benchmarks.studio.evals", "archive": "benchmarks.studio.archive",
         "memory": "benchmarks.studio.memory", "environments": "benchmarks.studio.environments",
         "domains": "benchmarks.studio.domains",
         "sandbox": "benchmarks.engine.sandbox", "sessions": "benchmarks.engine.sessions",
         "pipeline": "benchmarks.engine.pipeline", "trainer": "benchmarks.engine.trainer",
         "engine": "benchmarks.engine.engine", "serve": "benchmarks.engine.serve"}
# The engine's benchmarks read no settings: they are handed a sandbox backend from the studio's wiring.
BACKEND_DEFAULTS = {"sandbox": None, "sessions": None, "pipeline": "process"}


class Command(BaseCommand):
    help = "Run a benchmark area and print its figures."

    def add_arguments(self, parser):
        parser.add_argument("area", choices=sorted(AREAS))
        parser.add_argument("--json", action="store_true", help="print one JSON object (the default output too)")
        parser.add_argument("--instances", type=int, default=20_000, help="registry: task instances per template")
        parser.add_argument("--samples", type=int, default=100, help="sandbox, sessions: warm runs to time")
        parser.add_argument("--backend", help="sandbox, sessions, verify: process or docker (default: "
                                              "settings.SANDBOX_BACKEND)")
        parser.add_argument("--held-sessions", type=int, default=16,
                            help="sessions: sessions opened and held at once, their memory measured")
        parser.add_argument("--workspace-files", type=int, default=200,
                            help="sessions: files (2 KB each) of the generated repository the sessions work in")
        parser.add_argument("--trajectories", type=int, default=1_000_000,
                            help="ui, review: archived trajectories generated")
        parser.add_argument("--reviewers", type=int, default=10, help="review: reviewers labelling at once")
        parser.add_argument("--labels-each", type=int, default=100, help="review: labels each reviewer submits")
        parser.add_argument("--think-ms", type=int, default=1000,
                            help="review: a reviewer's mean pause between items in the paced phase")
        parser.add_argument("--streams", type=int, default=10, help="ui: runs streaming to open run pages at once")
        parser.add_argument("--stream-steps", type=int, default=30, help="ui: measured steps each streaming run writes")
        parser.add_argument("--warmup-steps", type=int,
                            help="ui: steps each streaming run writes first, not measured (pages warming up; default "
                                 "5); memory: steps trained before the growth is measured (default 50)")
        parser.add_argument("--step-seconds", type=float, default=1.0, help="ui: seconds between a run's steps")
        parser.add_argument("--skip-push", action="store_true", help="ui: only the trajectory list")
        parser.add_argument("--skip-list", action="store_true", help="ui: only the push latency")
        parser.add_argument("--steps", type=int,
                            help="pipeline, trainer: trainer steps per side; archive: steps written at each step "
                                 "size; memory: demo steps the embedded studio trains (default 200)")
        parser.add_argument("--environment-scale", type=float, default=0.1,
                            help="pipeline: the shortest environment time in seconds (the Pareto minimum)")
        parser.add_argument("--pipeline-workloads", nargs="+", default=["standard", "long_horizon"],
                            choices=["standard", "long_horizon"],
                            help="pipeline: standard (async against sync, heavy-tailed environment times; 30 steps a "
                                 "side by default), long_horizon (multi-turn tool tasks of 1 to 10 turns, async with "
                                 "partial rollouts on and off; 40 steps a side by default)")
        parser.add_argument("--tool-pretrain-steps", type=int, default=60,
                            help="pipeline: steps teaching the long-horizon workload's model to call its tool")
        parser.add_argument("--target-reward", type=float, default=0.6,
                            help="trainer: the reward moving average both trainers race to")
        parser.add_argument("--pretrain-steps", type=int, default=1500, help="trainer: steps teaching the base model")
        parser.add_argument("--smollm-steps", type=int, default=4, help="trainer: steps of the SmolLM2 workloads")
        parser.add_argument("--workloads", nargs="+", default=["tiny", "smollm2_lora"],
                            choices=["tiny", "smollm2", "smollm2_lora", "smollm2_full", "smollm2_lora_long", "sft",
                                     "dpo", "sft_tiny", "sft_smollm2", "dpo_tiny", "dpo_smollm2"],
                            help="trainer: which to compare on: the tiny Llama; SmolLM2 LoRA r16 4 prompts × 8 × 8 "
                                 "tokens (smollm2_lora, or smollm2), full fine-tune the same (smollm2_full), LoRA "
                                 "16 × 8 × 64 (smollm2_lora_long); SFT and DPO against TRL's SFTTrainer and "
                                 "DPOTrainer on the tiny Llama and SmolLM2 LoRA (sft, dpo: both of a kind)")
        parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32],
                            help="engine: concurrent requests, one measurement each")
        parser.add_argument("--new-tokens", type=int, default=64, help="engine: most tokens written per request")
        parser.add_argument("--repository-tasks", type=int, default=4,
                            help="engine, serve: repair tasks whose expert trajectories make the repository workload "
                                 "(each cut before each of its turns after the first: four prompts a task)")
        parser.add_argument("--compare", nargs="+", choices=["generate", "generate_batch"],
                            help="engine: what ours is compared with: transformers' model.generate (one batch) and "
                                 "generate_batch (its continuous batching, paged attention); default both on cuda, "
                                 "generate on the CPU (generate_batch polls there: ~20 s for 32 x 8 tokens of a "
                                 "tiny model)")
        parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                            help="engine, trainer: where the model runs (both sides of a comparison)")
        parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                            help="engine, trainer: the model's precision (both sides of a comparison)")
        parser.add_argument("--random-weights", action="store_true",
                            help="engine, trainer: the packaged model's architecture with random (seeded) weights, "
                                 "for speed only, where its weights cannot be had")
        parser.add_argument("--paired-items", type=int, default=10_000,
                            help="evals: paired items the statistics are timed over")
        parser.add_argument("--step-sizes", type=int, nargs="+", default=[16, 64, 256],
                            help="archive: trajectories a step writes, one measurement each")
        parser.add_argument("--writers", type=int, default=2, help="archive: runs writing steps at once (processes)")
        parser.add_argument("--subscribers", type=int, default=100, help="archive: websockets on one run's stream")
        parser.add_argument("--messages", type=int, default=500, help="archive: run.step messages fanned out")
        parser.add_argument("--artifact-objects", type=int, default=300, help="archive: PNG artifacts written")
        parser.add_argument("--artifact-mb", type=int, default=64, help="archive: 1 MiB artifacts written")
        parser.add_argument("--page-seconds", type=float, default=20.0,
                            help="memory: seconds between two rounds of the explorer and run pages")
        parser.add_argument("--sample-seconds", type=float, default=5.0,
                            help="memory: seconds between two readings of the server's resident memory")
        parser.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64],
                            help="environments: concurrent sessions, one measurement each (through the WebSocket "
                                 "and in-process)")
        parser.add_argument("--episodes", type=int, default=2, help="environments: episodes each session plays")
        parser.add_argument("--calls", type=int, default=4, help="environments: bash calls in each episode")
        parser.add_argument("--never-closed", type=int, default=1000,
                            help="environments: sessions that reset and then never speak nor close, freed by the "
                                 "idle timeout in waves (0: none)")
        parser.add_argument("--domains", type=int, nargs="+", default=[100, 1000],
                            help="domains: how many domains, one measurement each (10 is measured too, to compare)")
        parser.add_argument("--max-minutes", type=float, default=180.0,
                            help="memory: stop measuring after this long even if the run has not reached its steps")

    def handle(self, *args, area, **options):
        for name in ("steps", "warmup_steps"):  # each area's own default
            if options[name] is None:
                options.pop(name)
        if area in ("engine", "trainer", "serve"):
            options["models_dir"] = wiring.models_dir()
        if area in ("engine", "serve"):  # the repository workload: expert trajectories, replayed without a sandbox
            from apps.demo.repair_replays import conversations

            options["repository_conversations"] = conversations(options["repository_tasks"])
        if area == "trainer":
            options["workloads"] = tuple(options.pop("workloads"))
        if area in BACKEND_DEFAULTS:
            options["backend"] = wiring.sandbox_backend(options["backend"] or BACKEND_DEFAULTS[area])
        try:
            module = importlib.import_module(AREAS[area])
        except ModuleNotFoundError as exc:
            if exc.name != "benchmarks":
                raise  # a benchmark's own dependency (TRL for `bench trainer`: the bench extra) names itself
            raise CommandError("the benchmarks are not installed with the studio (the web image has none): run "
                               "`manage.py bench` from a checkout, where benchmarks/ sits beside manage.py") from None
        result = module.run(**options)
        self.stdout.write(json.dumps(result, indent=None if options["json"] else 2))

