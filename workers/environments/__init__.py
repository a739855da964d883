"""The studio's environments played by trainers elsewhere (TRL, verifiers, verl ...), Django-free like the rest of
the engine: an `Episode` is one task, its tool calls and the trajectory they make (episode.py). The studio serves
episodes over OpenEnv's protocol (apps/environments) and records each one as a trajectory of an external run.
"""
