from django.apps import AppConfig


class AuthoringConfig(AppConfig):
    name = "apps.authoring"
    verbose_name = "Authoring playgrounds"
