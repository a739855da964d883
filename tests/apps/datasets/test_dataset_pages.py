"""The dataset pages: built from the form (sources ticked, a file uploaded), mistakes shown at their field, a
version's rows with their provenance a page at a time, its JSONL downloaded as pinned, and only editors build."""

import hashlib
import json
import re

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from apps.accounts.models import AuditEvent
from apps.registry.models import Version


def _file(*rows) -> SimpleUploadedFile:
    return SimpleUploadedFile("extra.jsonl", "".join(json.dumps(row) + "\n" for row in rows).encode(),
                              content_type="application/jsonl")


def test_a_dataset_built_from_the_form_and_read_row_by_row(client, project, owner, member, labelled):
    queue, rows = labelled
    client.force_login(owner)
    url = reverse("datasets:new", kwargs={"project": project.slug})
    # The queue's page links to the build form with its pairs ticked.
    queue_page = client.get(reverse("review:queue", kwargs={"project": project.slug, "queue": queue.slug}))
    link = re.search(r'href="([^"]*pairs_queue=data)"', queue_page.content.decode())[1].replace("&amp;", "&")
    prefilled = client.get(link).context["form"]
    assert prefilled["use_review_pairs"].value() and prefilled["pairs_queue"].value() == "data"
    assert prefilled["format"].value() == "preference" and prefilled["slug"].value() == "data-pairs"
    form = {"slug": "from-review", "format": "sft", "exclude_eval_tasks": "on", "use_trajectories": "on",
            "traj_accepted_in": queue.slug, "traj_limit": "100",
            "upload": _file({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})}
    done = client.post(url, form)
    assert done.status_code == 302, done.context["form"].errors if done.context else done
    version = Version.objects.get(definition__slug="from-review")
    assert done.url == f"/p/{project.slug}/datasets/from-review/1/" and version.spec["rows"] == 3
    assert AuditEvent.objects.filter(action="dataset.build", target="dataset/from-review@1").exists()

    page = client.get(done.url, {"start": "2"})
    assert [number for number, _ in page.context["page"].rows] == [2, 3]
    html = page.content.decode()
    assert "trajectory" in html and "upload" in html and version.spec["content_sha256"] in html
    listing = client.get(reverse("datasets:list", kwargs={"project": project.slug})).content.decode()
    assert 'data-dataset="from-review"' in listing

    download = client.get(f"{done.url}rows.jsonl")
    body = b"".join(download.streaming_content)
    assert hashlib.sha256(body).hexdigest() == version.spec["content_sha256"]

    # Mistakes at their field: a bad file, a preference dataset of trajectories, no source at all.
    bad = client.post(url, {**form, "upload": _file({"messages": "nope"})})
    assert bad.status_code == 400 and "line 1" in str(bad.context["form"]["upload"].errors)
    wrong = client.post(url, {**form, "format": "preference", "upload": ""})
    assert wrong.status_code == 400 and "cannot take trajectories" in str(wrong.context["form"].errors)
    empty = client.post(url, {"slug": "x", "format": "sft", "exclude_eval_tasks": "on"})
    assert empty.status_code == 400 and "tick at least one source" in str(empty.context["form"].errors)

    rebuilt = client.post(f"{done.url}rebuild/")
    assert rebuilt.status_code == 302 and rebuilt.url == done.url  # the same rows: the same version

    client.force_login(member("viewer"))
    assert client.get(url).status_code == 403
    assert client.get(done.url).status_code == 200
