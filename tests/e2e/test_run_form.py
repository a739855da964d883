"""Starting a run from the form in a real browser: from the run list to the form, each kind showing only its own
settings as it is chosen, a changed group size, the review with the config hash, then "Queue run" lands on the new
run's page — the run carrying that group size and exactly the hash the review showed."""

import re

import pytest

from apps.runs.models import Run

pytestmark = pytest.mark.browser


def test_change_the_group_size_review_and_queue(page_as, live_url, project, owner, registry):
    page = page_as(owner)

    def setting(name):
        return page.locator(f"[data-setting={name}]")

    page.goto(f"{live_url}/p/{project.slug}/runs/")
    page.click("[data-start-run]")
    # The form's script is deferred: it listens once the new page has loaded, not as soon as the form is parsed (a
    # kind chosen before that changed nothing, in one CI run).
    page.wait_for_url(re.compile(r"/runs/new/$"), wait_until="load")
    group = page.locator("fieldset[data-group=GRPO]")
    assert group.locator("input[name=group_size]").get_attribute("max") == "1024"
    assert setting("batch_size").is_hidden()  # SFT's and DPO's, not GRPO's
    page.select_option("select[name=kind]", "sft")  # SFT's settings show; GRPO's hide, and are not posted
    assert setting("batch_size").is_visible() and setting("learning_rate").is_visible() and group.is_hidden()
    assert page.locator("input[name=group_size]").is_disabled() and setting("clip_high").is_hidden()
    assert setting("dpo_beta").is_hidden()  # DPO's alone
    page.select_option("select[name=kind]", "grpo")
    assert group.locator("input[name=group_size]").is_enabled() and setting("batch_size").is_hidden()
    assert page.locator("input[name=model_sha256]").is_disabled()  # set by the studio, whichever the kind
    page.fill("input[name=name]", "from-the-browser")
    page.fill("input[name=group_size]", "4")
    page.click("[data-review]")

    page.wait_for_selector("[data-config-hash]")
    shown = page.locator("[data-config-hash]").inner_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", shown)
    row = page.locator("tr[data-setting=group_size]")
    assert row.locator("[data-value]").inner_text() == "4" and row.get_attribute("data-origin") == "changed"
    assert page.locator("[data-estimate-bound]").inner_text().startswith("An upper bound, not a forecast")
    assert not Run.objects.exists()  # reviewed: nothing queued yet

    page.click("[data-queue]")
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}/$"))
    run = Run.objects.get()
    assert page.url.endswith(f"/runs/{run.pk}/")
    assert run.name == "from-the-browser" and run.config["group_size"] == 4 and run.config_hash == shown
    assert "is queued" in page.locator("main").inner_text()
