"""Endpoints name a credential from the studio's list (apps/accounts/credentials.py) instead of any environment
variable. An endpoint that named an operator's declared variable (STUDIO_ENDPOINT_KEY_<NAME>) is translated to
`operator:<NAME>`, what it meant; every other one keeps its `api_key_env` and is refused, with what to do, until an
editor picks a credential: it could name the studio's own secrets, and nothing may pick one for them."""

from django.db import migrations, models

PREFIX = "STUDIO_ENDPOINT_KEY_"


def translate_declared(apps, schema_editor):
    Endpoint = apps.get_model("evals", "Endpoint")
    for endpoint in Endpoint.objects.filter(api_key_env__startswith=PREFIX).exclude(api_key_env=PREFIX):
        endpoint.credential = "operator:" + endpoint.api_key_env[len(PREFIX):]
        endpoint.api_key_env = ""
        endpoint.save(update_fields=["credential", "api_key_env"])


class Migration(migrations.Migration):

    dependencies = [
        ("evals", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="endpoint",
            name="credential",
            field=models.CharField(blank=True, default="", max_length=80),
        ),
        migrations.RunPython(translate_declared, migrations.RunPython.noop),
    ]
