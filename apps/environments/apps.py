from django.apps import AppConfig


class EnvironmentsConfig(AppConfig):
    """The studio's environments served to trainers elsewhere over OpenEnv's protocol (`manage.py environments
    serve`): their episodes are recorded as trajectories of external runs (apps/runs/external.py). No models of its
    own; its server needs the `environments` extra (openenv-core) and runs in a process of its own."""

    name = "apps.environments"
    label = "environments"
