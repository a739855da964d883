"""Publishing from the browser: edit, new definition, aliases; every refusal leaves the registry unchanged."""

import pytest
import yaml
from django.urls import reverse

from apps.accounts.models import AuditEvent
from apps.registry.files import dump_yaml
from apps.registry.models import Alias, Definition, Version
from apps.registry.services import version_publish


def _url(name, project, kind="verifier", slug="numeric"):
    return reverse(f"registry:{name}", kwargs={"project": project.slug, "kind": kind, "slug": slug})


@pytest.fixture
def editor(member):
    return member("editor")


def test_edit_form_starts_from_the_newest_version(login, editor, project, registry):
    page = login(editor).get(_url("version_edit", project))
    form = page.context["form"]
    assert page.status_code == 200
    assert form.initial["expected_head"] == 1
    assert yaml.safe_load(form.initial["spec"]) == registry["verifier"].spec
    assert b"rubric: Is the arithmetic right?" in page.content


def test_edit_publishes_a_child_of_the_head(login, editor, project, registry):
    spec = {**registry["verifier"].spec, "pass_threshold": 0.5}
    response = login(editor).post(_url("version_edit", project),
                                  {"spec": dump_yaml(spec), "message": "accept half marks", "expected_head": 1,
                                   "action": "publish"})
    version = Version.objects.get(definition__slug="numeric", number=2)
    assert response.status_code == 302
    assert response["Location"] == reverse("registry:version_detail", kwargs={
        "project": project.slug, "kind": "verifier", "slug": "numeric", "number": 2})
    assert version.message == "accept half marks"
    assert version.parent == registry["verifier"]
    assert version.author == editor
    assert version.spec["pass_threshold"] == 0.5


def test_an_edit_is_reviewed_against_the_head_before_it_publishes(login, editor, project, registry):
    spec = {**registry["verifier"].spec, "pass_threshold": 0.5}
    page = login(editor).post(_url("version_edit", project),
                              {"spec": dump_yaml(spec), "message": "accept half marks", "expected_head": 1})
    assert page.status_code == 200
    assert Version.objects.filter(definition__slug="numeric").count() == 1  # nothing published yet
    assert [str(change) for change in page.context["changes"]] == ["~ pass_threshold: 1.0 -> 0.5"]
    # The template refers to the verifier by slug alone: it takes the new version from now on.
    assert page.context["effects"]["floating"] == ["task_template/add-two@1 (verifier: latest)"]
    assert b'value="publish"' in page.content and b"task_template/add-two@1 (verifier: latest)" in page.content


def test_a_bad_spec_names_the_field_keeps_the_text_and_publishes_nothing(login, editor, project, registry):
    text = dump_yaml({**registry["verifier"].spec, "pass_treshold": 0.5})
    page = login(editor).post(_url("version_edit", project),
                              {"spec": text, "message": "typo", "expected_head": 1})
    assert page.status_code == 400
    assert b"<code>pass_treshold</code>: unknown field" in page.content
    assert page.context["form"]["spec"].value() == text  # the author's text, not the stored spec
    assert Version.objects.filter(definition__slug="numeric").count() == 1


def test_a_yaml_syntax_error_is_shown_with_its_line(login, editor, project, registry):
    text = "layers:\n  - name: exact\n    kind: [exact\npass_threshold: 1\n"
    page = login(editor).post(_url("version_edit", project), {"spec": text, "message": "m", "expected_head": 1})
    assert page.status_code == 400
    assert b"malformed YAML: line 4" in page.content
    assert Version.objects.filter(definition__slug="numeric").count() == 1


def test_a_spec_that_is_not_a_mapping_is_refused(login, editor, project, registry):
    page = login(editor).post(_url("version_edit", project), {"spec": "- a\n- b\n", "message": "m",
                                                              "expected_head": 1})
    assert page.status_code == 400
    assert b"must be a YAML mapping" in page.content


def test_a_message_is_required(login, editor, project, registry):
    page = login(editor).post(_url("version_edit", project),
                              {"spec": dump_yaml(registry["verifier"].spec), "message": "", "expected_head": 1})
    assert page.status_code == 400
    assert page.context["form"].errors["message"]
    assert Version.objects.filter(definition__slug="numeric").count() == 1


def test_a_stale_edit_is_refused_and_points_to_the_diff(login, editor, owner, project, registry):
    version_publish(project=project, kind="verifier", slug="numeric", author=owner, message="meanwhile",
                    spec={**registry["verifier"].spec, "pass_threshold": 0.9})
    page = login(editor).post(_url("version_edit", project), {
        "spec": dump_yaml({**registry["verifier"].spec, "pass_threshold": 0.5}), "message": "mine",
        "expected_head": 1, "action": "publish"})
    assert page.status_code == 409
    assert b"is at @2 now" in page.content
    assert (_url("version_diff", project) + "?a=1&amp;b=2").encode() in page.content
    assert list(Version.objects.filter(definition__slug="numeric").values_list("message", flat=True)
                .order_by("number")) == ["", "meanwhile"]


def test_an_identical_spec_says_nothing_changed(login, editor, project, registry):
    page = login(editor).post(_url("version_edit", project), {
        "spec": dump_yaml(registry["verifier"].spec), "message": "no-op", "expected_head": 1, "action": "publish"})
    assert page.status_code == 200
    assert b"Nothing changed" in page.content
    assert Version.objects.filter(definition__slug="numeric").count() == 1


def test_new_definition_publishes_version_one(login, editor, project, registry):
    client = login(editor)
    form = client.get(reverse("registry:definition_create", kwargs={"project": project.slug}))
    assert form.status_code == 200
    assert b'<option value="sandbox_image">sandbox image</option>' in form.content
    spec = {"layers": [{"type": "base", "image": "python-3.12"}]}
    response = client.post(reverse("registry:definition_create", kwargs={"project": project.slug}), {
        "kind": "sandbox_image", "slug": "py-next", "description": "Newer Python", "spec": dump_yaml(spec),
        "message": "First version"})
    assert response.status_code == 302
    version = Version.objects.get(definition__kind="sandbox_image", definition__slug="py-next")
    assert (version.number, version.parent, version.message) == (1, None, "First version")
    assert version.definition.description == "Newer Python"


def test_new_definition_with_a_taken_slug_publishes_nothing(login, editor, project, registry):
    page = login(editor).post(reverse("registry:definition_create", kwargs={"project": project.slug}), {
        "kind": "verifier", "slug": "numeric", "spec": dump_yaml({**registry["verifier"].spec, "pass_threshold": 0.1}),
        "message": "clobber"})
    assert page.status_code == 409
    assert b"already exists" in page.content
    assert Version.objects.filter(definition__slug="numeric").count() == 1


def test_new_definition_with_a_bad_slug_says_why(login, editor, project, registry):
    page = login(editor).post(reverse("registry:definition_create", kwargs={"project": project.slug}), {
        "kind": "verifier", "slug": "Bad/Slug", "spec": dump_yaml(registry["verifier"].spec), "message": "m"})
    assert page.status_code == 400
    assert b"<code>slug</code>" in page.content
    assert not Definition.objects.filter(slug="Bad/Slug").exists()


def test_alias_form_moves_an_alias(login, editor, owner, project, registry):
    version_publish(project=project, kind="verifier", slug="numeric", author=owner,
                    spec={**registry["verifier"].spec, "pass_threshold": 0.9})
    client = login(editor)
    response = client.post(_url("alias_set", project), {"name": "prod", "number": 1})
    assert response.status_code == 302
    assert Alias.objects.get(name="prod").version == registry["verifier"]

    client.post(_url("alias_set", project), {"name": "prod", "number": 2})
    assert Alias.objects.get(name="prod").version.number == 2


@pytest.mark.parametrize("form, says", [
    ({"name": "Prod!", "number": 1}, b"an alias is lowercase letters"),
    ({"name": "latest", "number": 1}, b"always means the newest version"),
    ({"name": "prod", "number": 7}, b"verifier/numeric@7 does not exist"),
    ({"name": "prod", "number": ""}, b"Version: This field is required."),
])
def test_alias_form_refusals_explain_themselves(login, editor, project, registry, form, says):
    page = login(editor).post(_url("alias_set", project), form)
    assert page.status_code == 400
    assert says in page.content
    assert not Alias.objects.exists()


# --- YAML no spec needs: the form answers with its error, never a 500 -------------------------------------

DEEP_YAML = ("layers:\n- name: exact\n  kind: exact\n  checks:\n  - type: numeric\n  - type: json_schema\n"
             "    json_schema: " + "{a: " * 399 + "1" + "}" * 399 + "\n")
HUGE_YAML = "layers:\n- name: exact\n  kind: exact\n  checks:\n  - type: numeric\npass_threshold: 1" + "0" * 4999 + "\n"
WIDE_YAML = ("layers:\n- name: exact\n  kind: exact\n  checks:\n  - type: json_schema\n    json_schema: {maximum: 1"
             + "0" * 30 + "}\n")


@pytest.mark.parametrize("text, problem", [
    (DEEP_YAML, b"is nested deeper than 64 levels."),
    (HUGE_YAML, b"a value cannot be read: Exceeds the limit (4300 digits) for integer string conversion"),
    (WIDE_YAML, b"layers[0].checks[0].json_schema.maximum holds an integer beyond 64 bits."),
], ids=["nested-400-levels", "5000-digit-integer", "31-digit-integer"])
def test_new_definition_with_yaml_no_spec_needs_shows_the_form_error(login, editor, project, registry, text,
                                                                       problem):
    audits = AuditEvent.objects.count()
    page = login(editor).post(reverse("registry:definition_create", kwargs={"project": project.slug}), {
        "kind": "verifier", "slug": "odd", "spec": text, "message": "m"})
    assert page.status_code == 400, page.content[:300]
    assert problem in page.content
    assert page.context["form"].errors["spec"]
    assert not Definition.objects.filter(slug="odd").exists()
    assert AuditEvent.objects.count() == audits


@pytest.mark.parametrize("tagged", ["!!int ''", "!!float ''", "!!bool ''", "!!bool x", "!!timestamp x"])
def test_new_definition_with_a_tagged_scalar_yaml_cannot_read_shows_the_form_error(login, editor, project,
                                                                                    registry, tagged):
    text = ("layers:\n- name: exact\n  kind: exact\n  checks:\n  - type: json_schema\n    json_schema: {x: "
            + tagged + "}\n")
    page = login(editor).post(reverse("registry:definition_create", kwargs={"project": project.slug}), {
        "kind": "verifier", "slug": "odd", "spec": text, "message": "m"})
    assert page.status_code == 400, page.content[:300]
    assert page.context["form"].errors["spec"]
    assert not Definition.objects.filter(slug="odd").exists()


@pytest.mark.parametrize("text", [DEEP_YAML, HUGE_YAML, WIDE_YAML])
def test_an_edit_with_yaml_no_spec_needs_shows_the_form_error(login, editor, project, registry, text):
    page = login(editor).post(_url("version_edit", project), {"spec": text, "message": "m", "expected_head": 1})
    assert page.status_code == 400, page.content[:300]
    assert page.context["form"].errors["spec"]
    assert Version.objects.filter(definition__slug="numeric").count() == 1
