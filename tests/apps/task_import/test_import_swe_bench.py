"""`manage.py import_tasks --format swe-bench FILE --repos DIR` and the upload page's swe-bench format: repository
tasks validated through the real sandbox before they are published; a wrong gold patch is refused with its
reason, and what verification leaves out of a gold patch is said."""

import io
import json
import tarfile
import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.urls import reverse

from apps.registry.models import InstanceSetMember, Version
from apps.registry.services import version_publish
from tests.support.repository import (
    CONTEXT_GOLD_PATCH,
    FAIL_TO_PASS,
    FILES,
    GOLD_PATCH,
    PASS_TO_PASS,
    PLAIN_GOLD_PATCH,
    PYTEST_PIN,
    TEST_PATCH,
)
from workers.verifiers.repository import snapshot_contents

pytestmark = pytest.mark.sandbox


@pytest.fixture
def template(project, owner):
    def publish(kind, slug, spec):
        return version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner).version

    publish("sandbox_image", "repo-python", {"layers": [{"type": "base", "image": "python-3.11"},
                                                        {"type": "python_packages", "packages": [PYTEST_PIN]}]})
    publish("verifier", "repo-tests", {"layers": [{"name": "tests", "kind": "environment", "checks": [
        {"type": "repository_tests", "timeout_seconds": 30}]}]})
    return publish("task_template", "repo-fix", {"prompt_template": "{problem_statement}",
                                                  "sandbox_image": "repo-python", "verifier": "repo-tests"})


def row(instance_id: str, patch: str = GOLD_PATCH) -> dict:
    return {"instance_id": instance_id, "repo": "example/calc", "base_commit": "abc123", "version": "1.0",
            "problem_statement": "inclusive_range(a, b) leaves out b.", "patch": patch, "test_patch": TEST_PATCH,
            "FAIL_TO_PASS": json.dumps(FAIL_TO_PASS), "PASS_TO_PASS": PASS_TO_PASS}


def test_instances_are_validated_and_a_wrong_gold_patch_is_refused(template, tmp_path, capsys):
    repos = tmp_path / "repos"
    folder = repos / "calc__calc-1"  # a folder, with version control that could hold the fix
    for name, content in {**FILES, ".git/refs/heads/fix": b"0" * 40, ".git/HEAD": b"ref: refs/heads/fix\n"}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    for instance_id in ("calc__calc-3", "calc__calc-4"):
        for name, content in FILES.items():
            (repos / instance_id / name).parent.mkdir(parents=True, exist_ok=True)
            (repos / instance_id / name).write_bytes(content)
    with tarfile.open(repos / "calc__calc-2.tar.gz", "w:gz") as tar:  # an archive, one top folder as sdists have
        for name, content in FILES.items():
            info = tarfile.TarInfo(f"calc-1.0/{name}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    wrong = GOLD_PATCH.replace("range(a, b + 1)", "range(a, b + 2)")
    # diff -ru's plain unified diff, with a test file's section that verification leaves out
    plain = PLAIN_GOLD_PATCH + ("diff -ru a/tests/test_ranges.py b/tests/test_ranges.py\n"
                                "--- a/tests/test_ranges.py\t2024-05-02 10:00:00.000000000 +0000\n"
                                "+++ b/tests/test_ranges.py\t2024-05-02 10:05:00.000000000 +0000\n"
                                "@@ -1 +1 @@\n-from calc.ranges import largest, total\n"
                                "+from calc.ranges import total, largest\n")
    instances = tmp_path / "instances.jsonl"
    instances.write_text("\n".join(json.dumps(r) for r in [row("calc__calc-1"), row("calc__calc-2", wrong),
                                                           row("calc__calc-3", plain),
                                                           row("calc__calc-4", CONTEXT_GOLD_PATCH)]))
    with pytest.raises(CommandError, match="2 instance\\(s\\) refused"):
        call_command("import_tasks", str(instances), "--template", "repo-fix", "--format", "swe-bench",
                     "--repos", str(repos))
    out = capsys.readouterr().out
    assert "calc__calc-1: pass\n" in out and "calc__calc-2: test_failed" in out
    assert ("calc__calc-3: pass (left out of its gold patch: line 1 (not part of any file's diff: 'Only in b/calc: "
            "__pycache__'); tests/test_ranges.py (a test file))") in out
    assert ("calc__calc-4: gold_nothing_to_apply (left out of the diff: lines 1-11 (not part of any file's diff: "
            "'*** calc/ranges.py.orig") in out  # a context diff, which git apply does not read
    version = Version.objects.filter(definition__slug="repo-fix").order_by("-number").first()
    member, plain_member = InstanceSetMember.objects.filter(instance_set_id=version.instance_set_id) \
        .select_related("instance").order_by("key")
    assert member.key == "calc__calc-1" and plain_member.key == "calc__calc-3"
    assert sorted(snapshot_contents(member.instance.inputs["repository"])) == sorted(FILES)  # no .git
    assert member.instance.hidden["FAIL_TO_PASS"] == FAIL_TO_PASS and member.instance.hidden["base_commit"] == "abc123"


def test_a_file_whose_instances_all_fail_or_lack_a_repository_imports_nothing(template, tmp_path, capsys):
    repos = tmp_path / "repos"
    repos.mkdir()
    instances = tmp_path / "instances.jsonl"
    instances.write_text(json.dumps(row("calc__missing")) + "\n" + json.dumps({"instance_id": "../x"}) + "\n")
    with pytest.raises(CommandError, match="nothing was imported"):
        call_command("import_tasks", str(instances), "--template", "repo-fix", "--format", "swe-bench",
                     "--repos", str(repos))
    err = capsys.readouterr().err
    assert "line 1: no repository for it" in err and "line 2: missing problem_statement" in err
    with pytest.raises(CommandError, match="needs --repos"):
        call_command("import_tasks", str(instances), "--template", "repo-fix", "--format", "swe-bench")


def test_the_upload_page_takes_an_archive_validates_it_and_publishes_the_good_instances(template, tmp_path, login,
                                                                                          owner, project, settings):
    settings.EMBEDDED = True  # no broker: a thread of the web process validates the instances
    wrong = GOLD_PATCH.replace("range(a, b + 1)", "range(a, b + 2)")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        def add(name: str, content: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))

        add("instances.jsonl", "\n".join(json.dumps(r) for r in [row("calc__calc-1", PLAIN_GOLD_PATCH),
                                                                 row("calc__calc-2", wrong)]).encode())
        for instance_id in ("calc__calc-1", "calc__calc-2"):
            for name, content in FILES.items():
                add(f"repos/{instance_id}/{name}", content)
    client = login(owner)
    kwargs = {"project": project.slug, "kind": "task_template", "slug": "repo-fix"}
    response = client.post(reverse("task_import:task_upload", kwargs=kwargs),
                           {"format": "swe-bench", "file": SimpleUploadedFile("tasks.tar.gz", buffer.getvalue())})
    preview_url = response["Location"]
    text = client.get(preview_url).content.decode()
    assert "data-upload-progress" in text  # validated in the background: a sandbox run per instance
    progress_url = text.split('hx-get="')[1].split('"')[0].replace("&amp;", "&")
    deadline = time.monotonic() + 120
    while client.get(progress_url).get("HX-Refresh") != "true":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    text = client.get(preview_url).content.decode()
    assert "1 good, 1 bad" in text and "calc__calc-2: test_failed" in text
    assert "calc__calc-1: pass (left out of its gold patch: line 1 (not part of any file" in text  # diff -ru's
    job = text.split('name="job" value="')[1].split('"')[0]
    client.post(preview_url.split("?")[0] + "publish/", {"job": job, "expected_head": 1, "message": "calc tasks",
                                                         "query": "format=swe-bench", "skip_bad_rows": "on"})
    head = Version.objects.get(definition__slug="repo-fix", number=2)
    (member,) = InstanceSetMember.objects.filter(instance_set_id=head.instance_set_id)
    assert member.key == "calc__calc-1" and head.message == "calc tasks (1 bad row left out: calc__calc-2)"


def test_an_upload_that_unpacks_past_the_limit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    # A .tar.gz of zeros grows a thousandfold: the members' declared sizes are added up from the headers first.
    from apps.task_import.swe_bench import read_swe_bench_upload
    from workers.verifiers import repository

    monkeypatch.setattr(repository, "MAX_UNPACKED_BYTES", 1024 * 1024)
    archive = tmp_path / "bomb.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, size in (("instances.jsonl", 10), ("repos/zeros.bin", 2 * 1024 * 1024)):
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
    assert archive.stat().st_size < 10_000
    found = read_swe_bench_upload(archive, tmp_path / "unpacked", image=None, timeout=1)
    assert [e.field for e in found.errors] == ["bomb.tar.gz"] and "1 MB" in found.errors[0].problem
    assert not (tmp_path / "unpacked" / "repos" / "zeros.bin").exists()


def test_a_repository_archive_keeps_its_dotfiles_names(tmp_path):
    from workers.verifiers.repository import archive_files

    archive = tmp_path / "repo.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("./.pytest.ini", "./pkg/__init__.py", "./.github/ci.yml"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    assert sorted(archive_files(archive)) == [".github/ci.yml", ".pytest.ini", "pkg/__init__.py"]
