from django.db import migrations, models

REFERENCE_MODEL = "builtin:reference"


def kinds_from_configs(apps, schema_editor):
    """Until runs had a kind it was read from the config: a reference check's model is builtin:reference, an
    evaluation's config holds its suite."""
    Run = apps.get_model("runs", "Run")
    Run.objects.filter(config__model=REFERENCE_MODEL).update(kind="reference")
    Run.objects.filter(config__evaluation__has_key="suite").update(kind="evaluation")


class Migration(migrations.Migration):
    dependencies = [("runs", "0003_checkpoint_registry")]

    operations = [
        migrations.AddField(
            model_name="run", name="kind",
            field=models.CharField(choices=[("grpo", "GRPO training"), ("evaluation", "evaluation"),
                                            ("reference", "reference check")], default="grpo", max_length=16)),
        migrations.AddIndex(model_name="run", index=models.Index(fields=["kind", "status"],
                                                                 name="runs_run_kind_91b7f3_idx")),
        migrations.RunPython(kinds_from_configs, migrations.RunPython.noop),
    ]
