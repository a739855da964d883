"""Task uploads: task files read in every type (JSONL, JSONL.gz, CSV, Parquet) and through a column mapping, and
the upload pages: a bad file names its lines and publishes nothing; the fixed file previews its first tasks
rendered through the template and publishes the next version with all of them; a large file is read in the
background while the page shows its progress."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from apps.accounts.models import AuditEvent
from apps.registry.errors import SpecError
from apps.registry.models import Version
from apps.registry.services import version_publish
from apps.task_import.task_files import AS_NUMBER, PARQUET_BATCH, ColumnMapping, read_task_file, read_tasks
from apps.task_import.upload_jobs import uploads_root
from tests.support import ROOT
from tests.support.processes import wait_for
from tests.support.specimens import TEMPLATE_SPEC

QUIZ_SPEC = {**TEMPLATE_SPEC, "prompt_template": "Question: {prompt}\nAnswer with the number only."}
SUMS = [{"key": f"s{i:03d}", "a": i, "b": i % 7, "answer": i + i % 7} for i in range(1, 31)]


def quiz_lines(n: int = 200, bad: int | None = None) -> str:
    """n exact-answer rows, one a line; line `bad` (1-based) is broken JSON."""
    lines = [json.dumps({"key": f"q{i:03d}", "prompt": f"What is {i} + {i}?", "answer": 2 * i})
             for i in range(1, n + 1)]
    if bad:
        lines[bad - 1] = lines[bad - 1][:-1]  # the closing brace is gone
    return "\n".join(lines) + "\n"


# --- reading files ---------------------------------------------------------------------------------------------

def write_all_types(tmp_path, rows: list[dict]) -> dict:
    paths = {"jsonl.gz": tmp_path / "sums.jsonl.gz", "csv": tmp_path / "sums.csv", "parquet": tmp_path / "sums.parquet"}
    with gzip.open(paths["jsonl.gz"], "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    names = list(rows[0])
    paths["csv"].write_text(",".join(names) + "\n" + "".join(
        ",".join(str(row[name]) for name in names) + "\n" for row in rows), encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(rows), paths["parquet"], row_group_size=7)
    return paths


def test_csv_jsonl_gz_and_parquet_read_into_the_same_instances(tmp_path):
    paths = write_all_types(tmp_path, SUMS)
    # CSV values are text: the mapping reads these columns as numbers, which the others hold already.
    mapping = ColumnMapping(key="key", inputs={"a": "a", "b": "b"}, hidden=("answer",),
                            convert={"a": AS_NUMBER, "b": AS_NUMBER, "answer": AS_NUMBER})
    read = {kind: read_task_file(path, "columns", mapping=mapping) for kind, path in paths.items()}
    expected = [{"key": row["key"], "inputs": {"a": row["a"], "b": row["b"]}, "hidden": {"answer": row["answer"]}}
                for row in SUMS]
    assert read["jsonl.gz"] == read["csv"] == read["parquet"] == expected
    assert [read_tasks(path, "columns", mapping=mapping).file_type for path in paths.values()] == [
        "jsonl", "csv", "parquet"]

    # The benchmark formats read CSV and Parquet too.
    rows = [{"key": f"q{i}", "prompt": f"{i}+{i}?", "answer": str(2 * i)} for i in range(3)]
    answers = write_all_types(tmp_path, rows)
    assert len({json.dumps(read_task_file(path, "exact-answer")) for path in answers.values()}) == 1


def test_a_column_mapping_names_inputs_and_hidden_columns_and_every_bad_row(tmp_path):
    source = tmp_path / "odd.csv"
    source.write_text("id,question text,solution,notes\n"
                      "1,\"What is 2+2,\nexactly?\",4,easy\n"  # a quoted field over two lines: lines 2-3
                      "2,What is 3*3?,nine,\n"
                      "3,What is 1+1?\n"
                      "1,Again?,2,dup\n"
                      " 5,Spaced key?,5,\n", encoding="utf-8")
    mapping = ColumnMapping(key="id", inputs={"prompt": "question text"}, hidden=("solution",),
                            convert={"solution": AS_NUMBER})
    found = read_tasks(source, "columns", mapping=mapping)
    assert found.columns == ["id", "question text", "solution", "notes"] and found.rows == 5
    assert [str(e) for e in found.errors] == [
        "line 4: solution: 'nine' is not a number",
        "line 5: 2 fields; the header names 4 columns",
        "line 6: the key '1' is also on line 2",
        "line 7: the key ' 5' has spaces around it",
    ]
    assert found.instances == [{"key": "1", "inputs": {"prompt": "What is 2+2,\nexactly?"}, "hidden": {"solution": 4}}]
    with pytest.raises(SpecError, match="line 4"):
        read_task_file(source, "columns", mapping=mapping)

    # A JSONL row lacking a mapped column, a Parquet row past the first batch with no key: named by place.
    lines = tmp_path / "rows.jsonl"
    lines.write_text('{"id": 1, "q": "a"}\n{"id": 2}\n', encoding="utf-8")
    found = read_tasks(lines, "columns", mapping=ColumnMapping(key="id", inputs={"prompt": "q"}))
    assert [str(e) for e in found.errors] == ["line 2: missing column q"]
    rows = [{"id": i if i != PARQUET_BATCH + 10 else None, "q": f"question {i}"} for i in range(1, 2 * PARQUET_BATCH)]
    table = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), table)
    found = read_tasks(table, "columns", mapping=ColumnMapping(key="id", inputs={"prompt": "q"}))
    assert [str(e) for e in found.errors] == [f"row {PARQUET_BATCH + 10}: the key must be text or an integer, "
                                              "not empty"]
    assert len(found.instances) == 2 * PARQUET_BATCH - 2 and found.instances[0]["key"] == "1"


# --- the pages -------------------------------------------------------------------------------------------------

@pytest.fixture
def quiz(project, owner, registry):
    """A task template of its own, on the registry fixture's image and verifier, with no tasks yet."""
    return version_publish(project=project, kind="task_template", slug="quiz", spec=QUIZ_SPEC, author=owner,
                           instances=[]).version


def page(project, name, slug="quiz", **extra) -> str:
    """A page of the template's: an upload page by its name, another app's with its namespace."""
    return reverse(name if ":" in name else f"task_import:{name}",
                   kwargs={"project": project.slug, "kind": "task_template", "slug": slug, **extra})


def upload(client, project, content: bytes, name: str, fmt: str = "exact-answer", slug: str = "quiz"):
    return client.post(page(project, "task_upload", slug), {"format": fmt, "file": SimpleUploadedFile(name, content)})


def test_a_bad_line_is_named_and_nothing_is_published_then_the_fixed_file_is(login, owner, project, quiz):
    client = login(owner)
    detail = client.get(page(project, "registry:version_detail", number=1)).content.decode()
    assert page(project, "task_upload") in detail and "Upload tasks…" in detail
    assert page(project, "task_upload") == f"/p/{project.slug}/registry/task_template/quiz/upload/"  # as bookmarked
    versions = Version.objects.count()

    response = upload(client, project, quiz_lines(200, bad=57).encode(), "quiz.jsonl")
    assert response.status_code == 302
    preview = client.get(response["Location"])
    text = preview.content.decode()
    assert "line 57: not JSON" in text and "199 good, 1 bad" in text
    # Publishing the good rows only is offered, never preselected: as the form comes, it publishes nothing.
    assert '<input type="checkbox" name="skip_bad_rows" id="id_skip_bad_rows">' in text
    job = text.split('name="job" value="')[1].split('"')[0]
    refused = client.post(response["Location"].split("?")[0] + "publish/", {
        "job": job, "expected_head": 1, "message": "199 quiz tasks", "query": "format=exact-answer"}, follow=True)
    assert "The file has 1 bad row; nothing was published" in refused.content.decode()
    assert Version.objects.count() == versions

    response = upload(client, project, gzip.compress(quiz_lines(200).encode()), "quiz.jsonl.gz")
    text = client.get(response["Location"]).content.decode()
    assert "not JSON" not in text and "200 good, 0 bad" in text
    assert "Question: What is 1 + 1?\nAnswer with the number only." in text  # the first row, as prompted
    assert "Publish @2 with these 200 tasks" in text and Version.objects.count() == versions
    job = text.split('name="job" value="')[1].split('"')[0]
    published = client.post(response["Location"].split("?")[0] + "publish/", {
        "job": job, "expected_head": 1, "message": "200 quiz tasks", "query": "format=exact-answer"})
    head = Version.objects.get(definition__slug="quiz", number=2)
    assert published["Location"] == page(project, "registry:version_detail", number=2)
    assert head.instance_set.count == 200 and head.parent.number == 1 and head.message == "200 quiz tasks"
    assert Version.objects.count() == versions + 1
    assert not (uploads_root() / response["Location"].split("/")[-2]).exists()  # the published upload is gone


def test_the_preview_says_what_a_publish_replaces_and_can_leave_the_bad_rows_out(login, owner, project, quiz,
                                                                               tmp_path):
    """Against a head of 10 tasks, a file keeps 5 as they are, changes 1, leaves 4 out and adds 2, and one of its
    rows is bad: the preview counts each; publishing its good rows only is a choice the version's message (and its
    audit row) records."""
    head_file = tmp_path / "head.jsonl"
    head_file.write_text(quiz_lines(10), encoding="utf-8")
    version_publish(project=project, kind="task_template", slug="quiz", spec=QUIZ_SPEC, author=owner,
                    instances=read_task_file(head_file, "exact-answer"))
    rows = [json.loads(line) for line in quiz_lines(12).splitlines()]
    rows[5]["answer"] = 99  # q006 changed
    kept_changed_new = rows[:6] + rows[10:]  # q007-q010 left out; q011, q012 new
    lines = [json.dumps(row) for row in kept_changed_new]
    lines.insert(3, '{"key": "broken", "prompt": "What is')  # line 4
    client = login(owner)
    location = upload(client, project, ("\n".join(lines) + "\n").encode(), "quiz.jsonl")["Location"]
    text = client.get(location).content.decode()
    assert "8 good, 1 bad" in text and "line 4: not JSON" in text
    replacement = " ".join(text.split("data-replacement>")[1].split("</p>")[0].replace("<strong>", "")
                           .replace("</strong>", "").split())
    assert replacement == ("@3 will hold exactly the 8 good tasks; its spec is @2's. They replace the 10 existing "
                           "instances of @2: 5 kept unchanged, 1 changed, 4 removed (not in the file); 2 new.")

    job = text.split('name="job" value="')[1].split('"')[0]
    publish = {"job": job, "expected_head": 2, "message": "quiz tasks, revised", "query": "format=exact-answer"}
    refused = client.post(location.split("?")[0] + "publish/", publish, follow=True)
    assert "nothing was published" in refused.content.decode() and Version.objects.filter(number=3).count() == 0

    published = client.post(location.split("?")[0] + "publish/", {**publish, "skip_bad_rows": "on"}, follow=True)
    head = Version.objects.get(definition__slug="quiz", number=3)
    assert head.instance_set.count == 8
    assert head.message == "quiz tasks, revised (1 bad row left out: line 4)"
    assert "Published task_template/quiz@3 with 8 tasks; 1 bad row left out: line 4." in published.content.decode()
    audit = AuditEvent.objects.get(action="version.publish", target=head.ref)
    assert audit.details["message"] == head.message


def test_columns_are_mapped_on_the_preview_page(login, owner, project, registry):
    client = login(owner)  # add-two: "What is {a} + {b}?"
    csv_text = "id,x,y,expected\n" + "".join(f"t{i},{i},{i + 1},{2 * i + 1}\n" for i in range(5))
    response = upload(client, project, csv_text.encode(), "sums.csv", fmt="columns", slug="add-two")
    text = client.get(response["Location"]).content.decode()
    assert "data-mapping-form" in text and "data-publish" not in text  # no input called a or b: asked, not guessed
    query = {"format": "columns", "map": "1", "key": "id", "input-a": "x", "input-b": "y", "hidden": "expected",
             "as-1": "number", "as-2": "number", "as-3": "number"}
    text = client.get(response["Location"].split("?")[0], query).content.decode()
    # The verifier (numeric, reference "{answer}") could grade none of them: every row is refused, by its line.
    assert "data-publish" not in text and "line 2: the verifier cannot grade it" in text
    assert "names hidden field &#x27;answer&#x27;" in text
    csv_text = "id,x,y,answer\n" + "".join(f"t{i},{i},{i + 1},{2 * i + 1}\n" for i in range(5))
    response = upload(client, project, csv_text.encode(), "sums.csv", fmt="columns", slug="add-two")
    text = client.get(response["Location"].split("?")[0], {**query, "hidden": "answer"}).content.decode()
    assert "What is 0 + 1?" in text and "Publish @2 with these 5 tasks" in text
    assert "They replace the 20 existing instances of @1" in text

    # The benchmark format cannot fill {a} and {b}: said once, before any row is read.
    text = client.get(response["Location"].split("?")[0], {"format": "exact-answer"}).content.decode()
    assert "which the exact-answer format does not give" in text and "data-publish" not in text


def _read_in_the_background(client, project):
    response = upload(client, project, quiz_lines(3000).encode(), "big.jsonl")
    preview_url = response["Location"]
    text = client.get(preview_url).content.decode()
    assert "data-upload-progress" in text and "<progress" in text and 'hx-trigger="every 1s"' in text
    progress_url = text.split('hx-get="')[1].split('"')[0].replace("&amp;", "&")
    deadline = time.monotonic() + 60
    while (answer := client.get(progress_url)).get("HX-Refresh") != "true":
        assert answer.status_code == 200 and "<progress" in answer.content.decode()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return client.get(preview_url).content.decode()


@pytest.mark.redis
@pytest.mark.processes
def test_on_services_a_large_file_is_read_by_a_celery_worker_on_the_studio_queue(login, owner, project, quiz,
                                                                                 settings):
    """The `studio` queue's worker (docker-compose's studio-worker) shares the web server's data directory."""
    from apps.common import wiring

    settings.EMBEDDED, settings.TASK_UPLOAD_BACKGROUND_BYTES = False, 1000
    env = {**os.environ, "STUDIO_DATA_DIR": str(settings.DATA_DIR)}
    Path(settings.DATA_DIR).mkdir(parents=True, exist_ok=True)
    log = (Path(settings.DATA_DIR) / "studio-worker.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "studio", "worker", "-Q", "studio", "-P", "threads", "-c", "1",
         "-n", "studio@%h", "--without-gossip", "--without-mingle", "-l", "INFO"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: wiring.celery_app().control.ping(timeout=0.5), seconds=60, what="the worker to answer",
                 logs=Path(settings.DATA_DIR))
        text = _read_in_the_background(login(owner), project)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    assert "3000 good, 0 bad" in text and "Publish @2 with these 3000 tasks" in text
    assert "read_task_upload" in (Path(settings.DATA_DIR) / "studio-worker.log").read_text()


def test_a_large_file_is_read_in_the_background_with_progress(login, owner, project, quiz, settings):
    settings.EMBEDDED = True  # no broker: a thread of the web process reads it
    settings.TASK_UPLOAD_BACKGROUND_BYTES = 1000
    text = _read_in_the_background(login(owner), project)
    assert "3000 good, 0 bad" in text and "Publish @2 with these 3000 tasks" in text


def test_uploads_are_for_editors_and_their_own(login, owner, member, project, quiz, registry, settings):
    viewer = member("viewer")
    assert login(viewer).get(page(project, "task_upload")).status_code == 403
    assert upload(login(viewer), project, b"{}", "x.jsonl").status_code == 403
    client = login(owner)
    assert client.get(page(project, "task_upload", slug="numeric").replace("task_template", "verifier")) \
        .status_code == 404
    location = upload(client, project, quiz_lines(3).encode(), "q.jsonl")["Location"]
    assert login(member("editor")).get(location).status_code == 404  # another editor's upload

    # Too large, or no file: refused, and nothing is kept.
    settings.TASK_UPLOAD_MAX_BYTES = 100
    client = login(owner)
    response = upload(client, project, quiz_lines(20).encode(), "q.jsonl")
    assert response.status_code == 400 and "larger than" in response.content.decode()
    assert client.post(page(project, "task_upload"), {"format": "exact-answer"}).status_code == 400
    settings.TASK_UPLOAD_MAX_BYTES = 10_000
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner)
    assert upload(strict, project, quiz_lines(3).encode(), "q.jsonl").status_code == 403  # no CSRF token
    assert len(list(uploads_root().iterdir())) == 1  # the one good upload


def test_publishing_against_an_old_head_is_refused(login, owner, project, quiz):
    client = login(owner)
    location = upload(client, project, quiz_lines(4).encode(), "q.jsonl")["Location"]
    text = client.get(location).content.decode()
    job = text.split('name="job" value="')[1].split('"')[0]
    version_publish(project=project, kind="task_template", slug="quiz", author=owner,
                    spec={**QUIZ_SPEC, "system_prompt": "Be brief."})
    response = client.post(location.split("?")[0] + "publish/", {
        "job": job, "expected_head": 1, "message": "m", "query": "format=exact-answer"}, follow=True)
    assert "is at @2 now" in response.content.decode()
    assert Version.objects.filter(definition__slug="quiz").count() == 2
    assert "Publish @3 with these 4 tasks" in response.content.decode()  # the preview, against @2 now
