from django.apps import AppConfig


class SsoConfig(AppConfig):
    name = "apps.sso"
    label = "sso"
