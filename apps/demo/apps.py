from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo content (`manage.py seed_demo`): a user, a project and a small but real registry, published
    through the registry's services the way any author publishes. No models of its own."""

    name = "apps.demo"
    label = "demo"
