"""Spot checks become one case of a queue that follows runs: `spot_check_share` is now `follow_share`, and a spot
check's verifier moves into the queue's filters (verifier=verifier/SLUG) with the sampling rule "judged"."""

from django.db import migrations


def spot_checks_to_filters(apps, schema_editor):
    ReviewQueue = apps.get_model("review", "ReviewQueue")
    for queue in ReviewQueue.objects.exclude(spot_check_verifier=""):
        queue.filters = {**queue.filters, "verifier": f"verifier/{queue.spot_check_verifier}"}
        queue.sampling = {**queue.sampling, "rule": "judged"}
        queue.save(update_fields=["filters", "sampling"])


def filters_to_spot_checks(apps, schema_editor):
    ReviewQueue = apps.get_model("review", "ReviewQueue")
    for queue in ReviewQueue.objects.filter(spot_check_share__gt=0):
        verifier = queue.filters.get("verifier", "")
        queue.spot_check_verifier = verifier.removeprefix("verifier/").split("@")[0]
        queue.save(update_fields=["spot_check_verifier"])


class Migration(migrations.Migration):
    dependencies = [("review", "0004_spot_checks")]

    operations = [
        migrations.RunPython(spot_checks_to_filters, filters_to_spot_checks),
        migrations.RenameField("reviewqueue", "spot_check_share", "follow_share"),
        migrations.RemoveField("reviewqueue", "spot_check_verifier"),
    ]
