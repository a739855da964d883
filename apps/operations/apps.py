from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """The operator's commands: `sandbox` (run code in a sandbox, pool status, soak), `verify` (verdicts for
    responses), `bench` (speed and memory figures). No models."""

    name = "apps.operations"
    label = "operations"
