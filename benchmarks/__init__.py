"""Performance benchmarks: `manage.py bench AREA` (apps/operations/management/commands/bench.py) and the prepared
GPU check (deploy/gpu/check.sh). Not installed with the web app (pyproject.toml installs studio, apps and workers),
and nothing of the studio imports them: the bench command imports an area by its module's name when asked.

- studio/: the areas that need the studio (Django, the database, the pages): registry, verify, ui, review, evals,
  archive, memory.
- engine/: the areas that measure the engine alone, Django-free like it: sandbox, sessions, pipeline, trainer
  (with supervised.py, SFT and DPO against TRL), engine, serve; gpu_check.py runs engine and trainer on a GPU.

Each area is a module exposing run(**options) -> dict, its docstring saying what it measures and its targets.
"""
