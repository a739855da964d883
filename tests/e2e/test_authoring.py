"""Authoring in the browser, on Debian's Chromium: a new verifier written in the schema-aware editor from its
skeleton (a field completed, an error shown at its line and fixed there, then published), and tried in the
verifier playground on a task of the project (a pass and a fail, the seconds counted while it runs)."""

import io
import re

import pytest
from playwright.sync_api import expect

from apps.registry.models import Version

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_new_verifier_from_the_skeleton_with_completion_and_an_inline_fix(page_as, live_url, project, member,
                                                                            registry):
    page = page_as(member("editor"))
    page.goto(f"{live_url}/p/{project.slug}/registry/new/")
    page.select_option("#start-from", "skeleton:verifier")
    page.click("text=Fill in")
    expect(page.locator("#id_kind")).to_have_value("verifier")
    page.fill("#id_slug", "within-one")
    status = page.locator("#spec-status")
    expect(status).to_have_text("No problems: this spec publishes.")

    # A new field of the numeric check, completed from the schema: the check's own fields are offered (its type
    # narrows the union), not those of other check types.
    page.locator(".cm-line", has_text="reference:").click()
    page.keyboard.press("End")
    page.keyboard.press("Enter")
    page.keyboard.type("rel_tol")
    options = page.locator(".cm-tooltip-autocomplete li")
    expect(options.first).to_contain_text("rel_tolerance")
    assert not any("rubric" in text for text in options.all_text_contents())
    page.wait_for_timeout(150)  # CodeMirror ignores Enter for 75 ms after a list opens (its interactionDelay)
    page.keyboard.press("Enter")
    page.keyboard.type("-1")

    # The error is at the line it concerns, with the publish's own words, and publishing is refused meanwhile.
    expect(status).to_contain_text("rel_tolerance: Input should be greater than or equal to 0")
    expect(status).to_contain_text("1 problem(s)")
    marker_line = page.locator(".cm-lint-marker-error")
    expect(marker_line).to_have_count(1)
    text = page.evaluate("document.querySelector('textarea[data-spec-editor]').value").split("\n")
    number = int(re.search(r"line (\d+): layers\[0\]\.checks\[0\]\.rel_tolerance: Input should be greater than "
                           r"or equal to 0", status.inner_text())[1])
    assert text[number - 1].strip() == "rel_tolerance: -1"  # the problem is named at the line it concerns
    expect(page.locator(".cm-lintRange-error")).to_have_text("rel_tolerance: -1")  # which is underlined

    # Fixed inline: the number replaced; the problem goes away.
    page.keyboard.press("Backspace")
    page.keyboard.press("Backspace")
    page.keyboard.type("0.01")
    expect(status).to_have_text("No problems: this spec publishes.")
    expect(marker_line).to_have_count(0)
    # The field's documentation on hover, from the schema.
    page.locator(".cm-line span", has_text="pass_threshold").first.hover()
    expect(page.locator(".cm-tooltip-hover")).to_contain_text("a reward at or above this counts as a pass")
    page.click("button:has-text('Publish @1')")
    expect(page).to_have_url(re.compile(r"/registry/verifier/within-one/@1/$"))
    spec = Version.objects.get(definition__slug="within-one").spec
    assert spec["layers"][0]["checks"][0]["rel_tolerance"] == 0.01


def test_a_verifier_tried_in_the_playground_on_a_demo_task_passes_and_fails(page_as, live_url):
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from apps.accounts.models import Project
    from apps.registry.refs import Ref
    from apps.registry.selectors import instance_page, version_resolve

    call_command("seed_demo", stdout=io.StringIO())
    demo = Project.objects.get(slug="demo")
    task = instance_page(version=version_resolve(project=demo, ref=Ref("task_template", "add-two")), limit=1)[0]
    answer = task.instance.hidden["answer"]
    page = page_as(get_user_model().objects.get(username="demo"))
    page.goto(f"{live_url}/p/demo/registry/verifier/numeric-exact/")
    page.click("text=Try it in the playground")
    expect(page.locator("#id_template")).to_have_value("add-two")
    expect(page.locator("#id_key")).to_have_value(task.key)
    # While a check runs (seconds in a sandbox, a minute beside a training run), the form says so and counts the
    # seconds. Seen here on a form whose sending is then cancelled, since the numeric check answers at once.
    page.evaluate("document.querySelector('form[data-running]').addEventListener('submit', e => e.preventDefault())")
    page.fill("#id_response", "1")
    page.click("button:has-text('Verify')")
    expect(page.locator("[data-running-note]")).to_have_text(re.compile(r"^Verifying in a sandbox… [1-9] s$"))
    page.reload()
    page.fill("#id_response", f"{answer}")
    page.click("button:has-text('Verify')")
    verdict = page.locator(".verdict")
    expect(verdict).to_have_attribute("data-status", "pass")
    expect(verdict).to_contain_text("number decided")
    page.fill("#id_response", f"{answer + 1}")
    page.click("button:has-text('Verify')")
    expect(page.locator(".verdict")).to_have_attribute("data-status", "fail")
    expect(page.locator(".verdict table.checks")).to_contain_text(f"expected {answer}")


def test_references_complete_from_the_projects_definitions(page_as, live_url, project, member, registry):
    page = page_as(member("editor"))
    page.goto(f"{live_url}/p/{project.slug}/registry/new/?from=skeleton:task_template")
    page.locator(".cm-line", has_text="verifier:").click()
    page.keyboard.press("End")
    page.keyboard.press("Shift+Home")
    page.keyboard.type("verifier: num")
    page.keyboard.press("Control+Space")
    expect(page.locator(".cm-tooltip-autocomplete li").first).to_contain_text("numeric")
    page.wait_for_timeout(150)  # CodeMirror ignores Enter for 75 ms after a list opens (its interactionDelay)
    page.keyboard.press("Enter")
    spec = page.locator("textarea[data-spec-editor]")  # the form's field, kept in step with the editor
    expect(spec).to_have_value(re.compile(r"^verifier: numeric$", re.M))
    # The skeleton names the demo's image, which this project lacks: said at its line, in words.
    expect(page.locator("#spec-status")).to_contain_text("sandbox_image: No sandbox_image named 'python-3-11'")
