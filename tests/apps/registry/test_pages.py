"""The read-only registry pages show the real data: definitions, versions, specs, instances and diffs."""

import re

import pytest
from django.urls import reverse

from apps.registry import views
from apps.registry.services import version_publish


def _url(name, project, kind="verifier", slug="numeric", **extra):
    return reverse(f"registry:{name}", kwargs={"project": project.slug, "kind": kind, "slug": slug, **extra})


@pytest.fixture
def verifier_v2(project, owner, registry):
    spec = {**registry["verifier"].spec, "pass_threshold": 0.5}
    return version_publish(project=project, kind="verifier", slug="numeric", spec=spec, author=owner,
                           message="accept half marks").version


def test_list_groups_definitions_by_kind_with_counts(login, owner, project, registry, verifier_v2):
    page = login(owner).get(reverse("registry:definition_list", kwargs={"project": project.slug}))
    assert page.status_code == 200
    text = page.content.decode()
    for slug in ("py-basic", "numeric", "add-two", "arithmetic", "arith-bundle"):
        assert f"<code>{slug}</code>" in text
    assert "Exact-answer arithmetic" in text
    assert "Task template</h2>" in text  # the kind's label, not its stored value
    # numeric has two versions, and its newest links to @2
    assert _url("version_detail", project, number=2) in text
    assert re.search(r"<code>numeric</code>.*?<td class=\"num\">2</td>", text, re.S)


def test_kind_filter_shows_one_kind_and_answers_htmx_with_the_fragment(login, owner, project, registry):
    client = login(owner)
    url = reverse("registry:definition_list", kwargs={"project": project.slug})
    page = client.get(url, {"kind": "verifier"})
    assert b"<code>numeric</code>" in page.content
    assert b"<code>add-two</code>" not in page.content

    fragment = client.get(url, {"kind": "task_template"}, headers={"HX-Request": "true"})
    assert b"<code>add-two</code>" in fragment.content
    assert b"<code>numeric</code>" not in fragment.content
    assert b"<html" not in fragment.content


def test_definition_page_lists_versions_aliases_and_offers_a_diff(login, owner, project, registry, verifier_v2):
    from apps.registry.services import alias_move

    alias_move(version=registry["verifier"], name="prod", actor=owner)
    page = login(owner).get(_url("definition_detail", project))
    text = page.content.decode()
    assert page.status_code == 200
    assert "accept half marks" in text and "olive" in text
    assert verifier_v2.content_hash[:12] in text
    assert "<code>prod</code>" in text
    assert _url("version_diff", project) in text
    assert 'name="a"' in text and 'name="b"' in text


def test_version_page_shows_spec_as_yaml_and_metadata(login, owner, project, registry, verifier_v2):
    page = login(owner).get(_url("version_detail", project, number=2))
    text = page.content.decode()
    assert page.status_code == 200
    assert "pass_threshold: 0.5" in text
    assert "rubric: Is the arithmetic right?" in text
    assert verifier_v2.content_hash in text
    assert _url("version_detail", project, number=1) in text  # the parent


def test_unknown_version_or_definition_is_a_404_with_the_reason(login, owner, project, registry):
    client = login(owner)
    missing = client.get(_url("version_detail", project, number=9))
    assert missing.status_code == 404
    assert b"has versions 1..1" in missing.content
    assert client.get(_url("definition_detail", project, slug="nope")).status_code == 404
    assert client.get(_url("definition_detail", project, kind="gadget")).status_code == 404


def test_task_instances_page_by_key(login, owner, project, registry, monkeypatch):
    monkeypatch.setattr(views, "INSTANCES_PER_PAGE", 8)
    client = login(owner)
    url = _url("version_detail", project, kind="task_template", slug="add-two", number=1)

    first = client.get(url).content.decode()
    keys = re.findall(r"<code>(add-\d{5})</code>", first)
    assert keys == [f"add-{i:05d}" for i in range(8)]
    assert "&quot;b&quot;: 3" in first and "&quot;answer&quot;: 6" in first  # add-00003: inputs and hidden
    assert "?after=add-00007" in first

    second = client.get(url, {"after": "add-00007"}).content.decode()
    assert re.findall(r"<code>(add-\d{5})</code>", second)[0] == "add-00008"

    last = client.get(url, {"after": "add-00015"}).content.decode()
    assert re.findall(r"<code>(add-\d{5})</code>", last) == [f"add-{i:05d}" for i in range(16, 20)]
    assert "?after=" not in last  # 20 instances: no page after the last one


def test_diff_shows_changed_field_side_by_side(login, owner, project, registry, verifier_v2):
    page = login(owner).get(_url("version_diff", project), {"a": 1, "b": 2})
    text = page.content.decode()
    assert page.status_code == 200
    assert '<li class="changed">~ pass_threshold: 1.0 -&gt; 0.5</li>' in text
    old_line = re.search(r'<tr class="replace">.*?<td class="old">(.*?)</td>.*?<td class="new">(.*?)</td>', text, re.S)
    assert old_line.groups() == ("pass_threshold: 1.0", "pass_threshold: 0.5")


def test_diff_for_htmx_is_the_pane_only(login, owner, project, registry, verifier_v2):
    pane = login(owner).get(_url("version_diff", project), {"a": 2, "b": 1}, headers={"HX-Request": "true"})
    assert b"~ pass_threshold: 0.5 -&gt; 1.0" in pane.content
    assert b"<html" not in pane.content


@pytest.mark.parametrize("query, status, says", [
    ({}, 400, b"a and b must be version numbers"),
    ({"a": "one", "b": 2}, 400, b"a and b must be version numbers"),
    ({"a": 0, "b": 1}, 400, b"a and b must be version numbers"),
    ({"a": 1, "b": 7}, 404, b"verifier/numeric@7 does not exist"),
])
def test_diff_with_bad_versions_explains_itself(login, owner, project, registry, query, status, says):
    page = login(owner).get(_url("version_diff", project), query)
    assert page.status_code == status
    assert says in page.content
