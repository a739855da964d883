"""The run form (/p/<project>/runs/new/, apps/runs/launch.py): the chosen kind's config fields grouped with their
defaults, bounds and help, another kind's hidden; a review that shows the resolved config of the kind and its hash
before anything is queued, the hash then being the created run's; refusals at their field, a setting of another kind
among them; a start from an earlier run."""

import json
import re
from html.parser import HTMLParser

import pytest
from django import forms
from django.urls import reverse

from apps.datasets.services import dataset_build, dataset_upload
from apps.registry.services import version_publish
from apps.runs import launch, services
from apps.runs.models import Run, RunEvent
from apps.runs.services import RunError, run_config_resolve, run_create
from benchmarks.engine.supervised import addition_conversations
from workers.definitions.specs import FieldError
from workers.rl.config import BOUNDS, CONFIGS, SET_BY_THE_STUDIO, GRPOConfig, SFTConfig, field_help


class _Inputs(HTMLParser):
    """name -> value of the inputs inside the element carrying `marker` (what a browser would submit)."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker, self.depth, self.values = marker, 0, {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form" and self.marker in attrs:
            self.depth = 1
        elif self.depth and tag == "input" and "disabled" not in attrs and attrs.get("name"):
            self.values[attrs["name"]] = attrs.get("value", "")

    def handle_endtag(self, tag):
        if tag == "form":
            self.depth = 0


def submitted(response, marker: str) -> dict:
    parser = _Inputs(marker)
    parser.feed(response.content.decode())
    return parser.values


def filled(form, **changes) -> dict:
    """What the untouched form posts, with `changes` (False unticks a checkbox)."""
    data = {}
    for name, field in form.fields.items():
        value = form.initial.get(name, field.initial)
        if field.disabled or value is None:
            continue
        if isinstance(field, forms.BooleanField):
            if value:
                data[name] = "on"
            continue
        data[name] = field.prepare_value(value)
    for name, value in changes.items():
        if value is False:
            data.pop(name, None)
        else:
            data[name] = value
    return data


@pytest.fixture
def enqueued(monkeypatch):
    calls = []
    monkeypatch.setattr(services, "run_enqueue", calls.append)  # run_create(enqueue=True) hands the run over
    return calls


@pytest.fixture
def url(project):
    return reverse("runs:run_new", kwargs={"project": project.slug})


def test_review_shows_the_resolved_config_and_the_hash_the_queued_run_then_has(login, owner, registry, url,
                                                                                enqueued):
    client = login(owner)
    page = client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert re.search(r"<script(?![^>]*\bsrc=)", html) is None  # no inline script: the CSP allows none
    assert [title for title, _, _ in page.context["form"].groups()] == [title for title, _ in launch.GROUPS]
    assert re.search(r'name="group_size" value="8" min="1" max="1024"', html)  # default and bounds
    assert "Samples per task (the GRPO group)." in html  # help from the field's docstring
    assert re.search(r'name="model_sha256"[^>]*disabled', html)  # set by the studio: shown, not editable

    data = filled(page.context["form"], bundle=registry["bundle"].pk, steps=7, name="from-the-form",
                  group_size=4, action="review")
    review = client.post(url, data)
    assert review.status_code == 200 and review.context["review"]
    shown = re.search(r"<code data-config-hash>([0-9a-f]{64})</code>", review.content.decode()).group(1)
    assert review.context["overrides"] == {"group_size": 4}  # only what was changed
    rows = {name: (value, origin) for _, group in review.context["resolved"] for name, value, origin in group}
    assert rows["group_size"] == ("4", "changed") and rows["groups_per_step"] == ("8", "default")
    assert set(rows) == GRPOConfig.names()
    estimate = review.context["estimate"]
    # 8 groups × oversampling 4 (dynamic sampling) × 4 samples × 16 tokens (add-two's max_tokens), said as a bound
    assert (estimate.groups, estimate.rollouts, estimate.tokens) == (32, 128, 2048)
    assert "An upper bound, not a forecast" in review.content.decode()
    # The bundle names no model, nor does the form: the default is said at the top, not only in the table.
    assert rows["model"] == ("builtin:demo-tiny", "default")
    assert re.search(r"<div class=\"notice warning\" data-model-default>No model in the bundle or the form: this run "
                     r"trains builtin:demo-tiny \(the studio&#x27;s tiny demo model\)", review.content.decode())
    assert not Run.objects.exists() and enqueued == []  # reviewed, nothing queued

    confirm = submitted(review, "data-queue-form")  # the review's hidden form, as the browser sends it
    assert confirm["reviewed"] == shown
    queued = client.post(url, {**confirm, "action": "queue"})
    run = Run.objects.get()
    assert queued.status_code == 302 and queued["Location"].endswith(f"/runs/{run.pk}/")
    assert run.config_hash == shown and run.config["group_size"] == 4 and run.steps_total == 7
    assert run.name == "from-the-form" and run.status == "queued" and enqueued == [run]
    assert RunEvent.objects.get(run=run, kind="created").details == {"config": {"group_size": 4}}


def test_a_value_out_of_bounds_is_refused_at_its_field_and_nothing_is_queued(login, owner, registry, url,
                                                                              enqueued):
    client = login(owner)
    form = client.get(url).context["form"]
    base = filled(form, bundle=registry["bundle"].pk)
    for action in ("review", "queue"):
        page = client.post(url, {**base, "group_size": BOUNDS["group_size"][1] + 1, "action": action})
        assert page.status_code == 400 and "less than or equal to 1024" in page.context["form"].errors["group_size"][0]
    # Within the input's bounds, refused by GRPOConfig's checks: still at its field.
    page = client.post(url, {**base, "group_size": 1, "action": "review"})
    assert page.status_code == 400 and "GRPO compares samples" in page.context["form"].errors["group_size"][0]
    page = client.post(url, {**base, "device": "cuda;rm -rf", "action": "review"})
    assert "is not auto, cpu, cuda or cuda:N" in page.context["form"].errors["device"][0]
    page = client.post(url, {**base, "model": "builtin:gpt-5", "action": "review"})
    assert "unknown built-in model" in page.context["form"].errors["model"][0]
    page = client.post(url, {**base, "domain_weights": "[1]", "action": "review"})
    assert "JSON object" in page.context["form"].errors["domain_weights"][0]
    page = client.post(url, {**base, "domain_weights": '{"arithmetic": 5000}', "action": "review"})
    assert "weights must be numbers from 0 to 1000" in page.context["form"].errors["domain_weights"][0]
    # Queueing what no review showed (no hash, or another one) shows the review instead.
    stale = client.post(url, {**base, "group_size": 4, "reviewed": "0" * 64, "action": "queue"})
    assert stale.status_code == 409 and stale.context["review"] and b"data-stale" in stale.content
    assert not Run.objects.exists() and enqueued == []


def test_the_bundles_run_config_shows_in_the_review_and_unchanged_fields_do_not_override_it(
        login, owner, project, registry, url, enqueued):
    bundle = version_publish(project=project, kind="bundle", slug="warm", author=owner,
                             spec={"members": ["domain/arithmetic@latest"], "run_config": {"temperature": 0.5}}).version
    client = login(owner)
    page = client.get(url)
    assert "warm@1 (sets temperature=0.5)" in page.content.decode()
    review = client.post(url, filled(page.context["form"], bundle=bundle.pk, seed=3, action="review"))
    rows = {name: (value, origin) for _, group in review.context["resolved"] for name, value, origin in group}
    assert rows["temperature"] == ("0.5", "bundle") and rows["seed"] == ("3", "changed")
    assert review.context["overrides"] == {"seed": 3}


def test_a_bundle_that_names_the_default_model_gets_no_default_model_warning(login, owner, project, registry, url,
                                                                          enqueued):
    bundle = version_publish(project=project, kind="bundle", slug="named", author=owner,
                             spec={"members": ["domain/arithmetic@latest"],
                                   "run_config": {"model": "builtin:demo-tiny"}}).version
    client = login(owner)
    review = client.post(url, filled(client.get(url).context["form"], bundle=bundle.pk, action="review"))
    rows = {name: (value, origin) for _, group in review.context["resolved"] for name, value, origin in group}
    assert rows["model"] == ("builtin:demo-tiny", "bundle")
    assert review.context["model_note"] == "" and b"data-model-default" not in review.content
    assert b"<code data-model>builtin:demo-tiny</code>" in review.content


def test_a_start_from_an_earlier_run_is_prefilled_with_its_config(login, owner, project, registry, url, enqueued):
    earlier = run_create(project=project, bundle=registry["bundle"], steps=12, name="earlier", actor=owner,
                         overrides={"group_size": 4, "temperature": 0.7, "dynamic_sampling": False})
    client = login(owner)
    page = client.get(url, {"from_run": str(earlier.pk)})
    form = page.context["form"]
    assert form.initial["group_size"] == 4 and form.initial["bundle"] == registry["bundle"].pk
    assert form.initial["steps"] == 12 and b"data-earlier" in page.content
    assert re.search(rf'<option value="{earlier.pk}" selected>', page.content.decode())
    # Unchanged, it resolves to the earlier run's config exactly: the same hash.
    review = client.post(url, {**filled(form), "action": "review"})
    assert review.context["config_hash"] == earlier.config_hash
    assert review.context["overrides"] == {"group_size": 4, "temperature": 0.7, "dynamic_sampling": False}
    assert client.get(url, {"from_run": "not-a-run"}).status_code == 200  # a bad id: the defaults, and says so


def test_only_editors_open_the_form(client, member, outsider, url):
    for user, status in ((member("viewer"), 403), (outsider, 404), (member("editor"), 200)):
        client.force_login(user)
        assert client.get(url).status_code == status, user
        assert client.post(url, {"action": "queue"}).status_code in (status, 400), user
    assert not Run.objects.exists()


def test_every_config_field_has_a_group_and_help_and_the_studios_are_not_editable():
    # the kinds the studio launches (a run trained elsewhere has no form: its config is what its trainer said)
    names = sorted(set().union(*(cls.names() for cls in CONFIGS.values() if cls.launched_here)))
    grouped = [name for _, members in launch.grouped(names) for name in members]
    assert launch.OTHER not in dict(launch.grouped(names)), "give the new config field a group in GROUPS"
    assert sorted(grouped) == sorted(names) and len(grouped) == len(set(grouped))
    assert not [name for name in names if not field_help().get(name)], "document the field under it"
    for name in SET_BY_THE_STUDIO:
        assert launch.config_field(name, str).disabled


def test_a_bundles_page_starts_a_run_on_it(login, member, project, registry):
    client = login(member("editor"))
    bundle = registry["bundle"]
    page = client.get(reverse("registry:definition_detail", kwargs={"project": project.slug, "kind": "bundle",
                                                                    "slug": bundle.definition.slug}))
    link = reverse("runs:run_new", kwargs={"project": project.slug}) + f"?bundle={bundle.pk}"
    assert link.encode() in page.content
    form = client.get(link).context["form"]
    assert form.initial["bundle"] == bundle.pk


def test_a_refusal_puts_each_problem_at_the_field_it_names_read_from_the_error_not_its_words(project, registry):
    def valid_form():
        form = launch.RunForm(filled(launch.RunForm(None, project=project), bundle=registry["bundle"].pk),
                              project=project)
        assert form.is_valid(), form.errors
        return form

    # The engine's ConfigError names each field; the run's refusal carries them.
    with pytest.raises(RunError) as refused:
        run_config_resolve(project=project, bundle=registry["bundle"], overrides={"group_size": 1, "temperature": 0.0})
    assert [problem.field for problem in refused.value.errors] == ["group_size", "temperature"]
    form = valid_form()
    form.add_config_error(refused.value)
    assert form.errors["group_size"] == ["GRPO compares samples, so a group needs at least 2"]
    assert form.errors["temperature"] == ["must be above 0"]

    # A problem's own words may hold '; ' and another field's name: they stay that field's problem.
    form = valid_form()
    form.add_config_error(RunError("config: ...", errors=[
        FieldError("device", "cuda:3 is busy; group_size: would not fit either"),
        FieldError("model_version", "set by the studio"), FieldError("no_such_knob", "unknown setting")]))
    assert form.errors["device"] == ["cuda:3 is busy; group_size: would not fit either"]
    assert "group_size" not in form.errors  # set by the studio, or not on the form: at the top, named
    assert form.non_field_errors() == ["config: model_version: set by the studio",
                                       "config: no_such_knob: unknown setting"]
    form = valid_form()
    form.add_config_error(RunError("steps must be a whole number of at least 1, not 0"))
    assert form.non_field_errors() == ["steps must be a whole number of at least 1, not 0"]


def test_without_a_bundle_only_sft_and_dpo_are_reviewed_and_their_dataset_is_pinned_at_the_review(
        login, owner, registry, url, enqueued, chats):
    client = login(owner)
    form = client.get(url).context["form"]
    assert form.initial["bundle"] == registry["bundle"].pk  # a new form starts on a bundle: GRPO needs one
    base = filled(form, bundle="", action="review")
    page = client.post(url, base)
    assert page.status_code == 400 and "a GRPO run samples its bundle's tasks" in page.context["form"].errors[
        "bundle"][0]
    # The dataset is pinned, and checked, where the config is resolved: the review already refuses a missing one.
    refused = client.post(url, {**base, "kind": "sft", "dataset": "dataset/missing@1"})
    assert refused.status_code == 400
    assert refused.context["form"].errors["dataset"] == ["No dataset named 'missing' in project 'acme-rl'."]
    review = client.post(url, {**base, "kind": "sft", "dataset": chats.ref})
    html = review.content.decode()
    assert review.status_code == 200 and review.context["estimate"] is None
    assert "none: the dataset alone" in html and "A sft run samples nothing" in html and "upper bound" not in html
    assert not Run.objects.exists() and enqueued == []


@pytest.fixture
def chats(project, owner):
    """dataset/sums@1: four SFT conversations."""
    content = "".join(json.dumps(row) + "\n" for row in addition_conversations(4)).encode()
    upload = dataset_upload(project=project, name="sums.jsonl", fmt="sft", content=content, actor=owner)
    return dataset_build(project=project, slug="sums", fmt="sft", sources=[upload.source()], actor=owner).version


def test_an_sft_run_shows_and_takes_only_its_own_settings(login, owner, registry, url, enqueued, chats):
    """An SFT run's form and review once showed GRPO's settings (group_size, clip_high) and took them."""
    client = login(owner)
    form = client.get(url).context["form"]
    sft = filled(form, bundle=registry["bundle"].pk, kind="sft", dataset=chats.ref, batch_size=4, steps=3,
                 action="review")
    # A GRPO setting changed on an SFT run (a browser without the form's script posts it) is refused at its field.
    refused = client.post(url, {**sft, "group_size": 4, "clip_high": 0.3})
    assert refused.status_code == 400
    assert refused.context["form"].errors["group_size"] == ["group_size is a GRPO setting; an SFT run does not use it"]
    assert refused.context["form"].errors["clip_high"] == ["clip_high is a GRPO setting; an SFT run does not use it"]
    html = refused.content.decode()
    assert re.search(r'<p data-setting="group_size" data-kinds="grpo">', html)  # shown, to read its error
    assert re.search(r'<p data-setting="temperature" data-kinds="grpo" hidden>', html)
    assert re.search(r'<p data-setting="batch_size" data-kinds="sft dpo">', html)
    assert not Run.objects.exists()

    # The review: SFT's settings alone, the dataset pinned (its file and hash), and the hash the queued run carries.
    review = client.post(url, sft)
    assert review.status_code == 200
    rows = {name: (value, origin) for _, group in review.context["resolved"] for name, value, origin in group}
    assert set(rows) == SFTConfig.names()
    assert rows["batch_size"] == ("4", "changed") and rows["dataset"] == (chats.ref, "changed")
    assert rows["dataset_sha256"] == (chats.spec["content_sha256"], "studio")
    assert 'data-setting="group_size"' not in review.content.decode()
    assert 'data-setting="clip_high"' not in review.content.decode()
    confirm = submitted(review, "data-queue-form")
    assert "group_size" not in confirm and confirm["batch_size"] == "4"  # only the kind's settings go on
    # Back to the form from the review: GRPO's settings, not posted, are at their starting values should GRPO be
    # chosen again.
    edit = client.post(url, {**confirm, "action": "edit"}).content.decode()
    assert re.search(r'<input[^>]*name="group_size" value="8"[^>]*disabled', edit)
    ticked = re.search(r'<input[^>]*name="dynamic_sampling"[^>]*>', edit).group(0)
    assert " checked" in ticked and " disabled" in ticked
    queued = client.post(url, {**confirm, "action": "queue"})
    run = Run.objects.get()
    assert queued.status_code == 302 and run.kind == "sft" and enqueued == [run]
    assert set(run.config) == SFTConfig.names() and run.config_hash == review.context["config_hash"]

    # Started again from it, the form shows SFT's settings; GRPO's are hidden and disabled (not posted).
    again = client.get(url, {"from_run": str(run.pk)})
    assert again.context["form"].chosen_kind == "sft"
    html = again.content.decode()
    assert re.search(r'<p data-setting="group_size" data-kinds="grpo" hidden>[^<]*<label[^>]*>group_size:</label> '
                     r'<input[^>]*name="group_size"[^>]*disabled', html)
    assert re.search(r'<fieldset data-group="GRPO" hidden>', html)
    assert re.search(r'<p data-setting="batch_size" data-kinds="sft dpo">[^<]*<label[^>]*>batch_size:</label> '
                     r'<input[^>]*name="batch_size" value="4"', html)
