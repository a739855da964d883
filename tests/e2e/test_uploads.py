"""Uploading tasks in a real browser: a file with a bad line is named by the preview and is not published unless
its good rows only are asked for; the fixed file previews its first task as the model is prompted, and publishing
it lands on the new version with every task."""

import json

import pytest

from apps.registry.models import Version
from apps.registry.services import version_publish
from tests.support.specimens import TEMPLATE_SPEC

pytestmark = pytest.mark.browser

QUIZ_SPEC = {**TEMPLATE_SPEC, "prompt_template": "Question: {prompt}\nAnswer with the number only."}


def quiz_file(tmp_path, name: str, bad: int | None = None):
    lines = [json.dumps({"key": f"q{i:03d}", "prompt": f"What is {i} + {i}?", "answer": 2 * i}) for i in range(1, 201)]
    if bad:
        lines[bad - 1] = lines[bad - 1].replace('"answer":', '"answer"')  # no colon: not JSON
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_upload_preview_and_publish(page_as, live_url, project, owner, registry, tmp_path, screenshot):
    version_publish(project=project, kind="task_template", slug="quiz", spec=QUIZ_SPEC, author=owner, instances=[])
    page = page_as(owner)
    page.goto(f"{live_url}/p/{project.slug}/registry/task_template/quiz/@1/")
    page.click("[data-upload-tasks]")

    page.set_input_files("input[name=file]", str(quiz_file(tmp_path, "quiz.jsonl", bad=57)))
    page.select_option("select[name=format]", "exact-answer")
    page.click("[data-upload-form] button[type=submit]")
    errors = page.locator("[data-upload-errors]")
    assert "line 57: not JSON" in errors.inner_text()
    # Publishing the 199 good rows only is offered, unticked: publishing as the form comes is refused.
    assert not page.is_checked("input[name=skip_bad_rows]")
    page.click("[data-publish]")
    assert "The file has 1 bad row; nothing was published." in page.inner_text("main")
    assert Version.objects.filter(definition__slug="quiz").count() == 1

    page.click("text=upload it again")
    page.set_input_files("input[name=file]", str(quiz_file(tmp_path, "quiz-fixed.jsonl")))
    page.click("[data-upload-form] button[type=submit]")
    first = page.locator("[data-preview-row]").first
    prompt = first.locator("[data-rendered-user]").inner_text()
    assert prompt == "Question: What is 1 + 1?\nAnswer with the number only."
    assert page.locator("[data-preview-row]").count() == 5
    assert page.locator("[data-upload-errors]").count() == 0
    screenshot(page, "task-upload-preview")
    button = page.locator("[data-publish]")
    assert button.inner_text() == "Publish @2 with these 200 tasks"
    page.fill("input[name=message]", "200 quiz tasks")
    button.click()

    page.wait_for_url(f"{live_url}/p/{project.slug}/registry/task_template/quiz/@2/")
    assert "Published task_template/quiz@2 with 200 tasks." in page.inner_text("main")
    head = Version.objects.get(definition__slug="quiz", number=2)
    assert head.instance_set.count == 200 and head.message == "200 quiz tasks"


def test_a_large_file_shows_its_progress_then_its_preview(page_as, live_url, project, owner, registry, tmp_path,
                                                         settings):
    settings.TASK_UPLOAD_BACKGROUND_BYTES = 1000  # read in the background; the page polls its progress
    settings.EMBEDDED = True  # by a thread of the server: no Celery worker serves the studio queue here
    version_publish(project=project, kind="task_template", slug="quiz", spec=QUIZ_SPEC, author=owner, instances=[])
    page = page_as(owner)
    page.goto(f"{live_url}/p/{project.slug}/registry/task_template/quiz/upload/")
    page.set_input_files("input[name=file]", str(quiz_file(tmp_path, "quiz.jsonl")))
    page.click("[data-upload-form] button[type=submit]")
    page.wait_for_selector("[data-publish]")  # the page reloaded itself once the job was done
    assert page.locator("[data-upload-progress]").count() == 0
    assert page.locator("[data-upload-summary]").inner_text().startswith("200 rows read")
