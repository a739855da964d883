"""Reading the registry: definitions, versions by number/alias/latest, pages, diffs, instances, bundles."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.registry.services import alias_move, version_publish
from tests.support.specimens import TEMPLATE_SPEC, VERIFIER_SPEC, addition_instances

DEFINITIONS = "/projects/acme-rl/definitions"
VERIFIER = DEFINITIONS + "/verifier/numeric"
TEMPLATE = DEFINITIONS + "/task_template/add-two"


@pytest.fixture
def api(api_as, member, registry):
    return api_as(member("viewer"))


@pytest.fixture
def verifier_history(project, owner, registry):
    """verifier/numeric at @1..@5, pass_threshold 1.0, 0.9, 0.8, 0.7, 0.6; prod -> @3."""
    versions = [registry["verifier"]]
    for number in range(2, 6):
        spec = {**VERIFIER_SPEC, "pass_threshold": round(1.1 - number / 10, 1)}
        versions.append(version_publish(project=project, kind="verifier", slug="numeric", spec=spec, author=owner,
                                        message=f"threshold for @{number}").version)
    alias_move(version=versions[2], name="prod", actor=owner)
    return versions


def test_definitions_list_with_counts(api, verifier_history):
    listed = {(d["kind"], d["slug"]): d for d in api.get(DEFINITIONS).json()}
    assert set(listed) == {("sandbox_image", "py-basic"), ("verifier", "numeric"), ("task_template", "add-two"),
                           ("domain", "arithmetic"), ("bundle", "arith-bundle")}
    assert (listed["verifier", "numeric"]["version_count"], listed["verifier", "numeric"]["head_number"]) == (5, 5)
    assert listed["domain", "arithmetic"]["description"] == "Exact-answer arithmetic"
    assert [d["slug"] for d in api.get(DEFINITIONS, kind="domain").json()] == ["arithmetic"]


def test_definition_detail_has_aliases_and_newest_versions(api, verifier_history):
    detail = api.get(VERIFIER).json()
    assert (detail["kind"], detail["slug"], detail["version_count"], detail["head_number"]) == ("verifier", "numeric",
                                                                                                5, 5)
    assert [(a["name"], a["version"]) for a in detail["aliases"]] == [("prod", 3)]
    assert [v["number"] for v in detail["versions"]] == [5, 4, 3, 2, 1]
    assert "spec" not in detail["versions"][0]
    assert detail["versions"][0]["parent"] == 4 and detail["versions"][-1]["parent"] is None


def test_versions_page_newest_first_by_keyset(api, verifier_history):
    first = api.get(VERIFIER + "/versions", limit=2).json()
    assert [v["number"] for v in first["items"]] == [5, 4]
    assert first["next_before"] == 4
    second = api.get(VERIFIER + "/versions", limit=2, before=first["next_before"]).json()
    assert [v["number"] for v in second["items"]] == [3, 2]
    last = api.get(VERIFIER + "/versions", limit=2, before=second["next_before"]).json()
    assert ([v["number"] for v in last["items"]], last["next_before"]) == ([1], None)
    exact = api.get(VERIFIER + "/versions", limit=5).json()
    assert (len(exact["items"]), exact["next_before"]) == (5, None)


@pytest.mark.parametrize("ref, number", [("1", 1), ("3", 3), ("prod", 3), ("latest", 5)])
def test_version_by_number_alias_or_latest(api, verifier_history, ref, number):
    version = api.get(f"{VERIFIER}/versions/{ref}").json()
    stored = verifier_history[number - 1]
    assert version == {
        "ref": f"verifier/numeric@{number}", "kind": "verifier", "slug": "numeric", "number": number,
        "spec": stored.spec, "schema_version": 1, "content_hash": stored.content_hash,
        "parent": number - 1 if number > 1 else None, "message": stored.message, "author": "olive",
        "created_at": version["created_at"], "instance_count": None,
    }


def test_task_template_version_counts_its_instances(api):
    assert api.get(TEMPLATE + "/versions/1").json()["instance_count"] == 20


def test_diff_lists_changed_fields(api, verifier_history):
    assert api.get(VERIFIER + "/diff", a=1, b="prod").json() == [
        {"path": "pass_threshold", "op": "changed", "old": 1.0, "new": 0.8}]
    assert api.get(VERIFIER + "/diff", a=2, b=2).json() == []


def test_diff_reports_added_and_removed_fields(api, project, owner, registry):
    spec = {**TEMPLATE_SPEC, "tools": [{"name": "calculator"}]}
    version_publish(project=project, kind="task_template", slug="add-two", spec=spec, author=owner)
    changes = api.get(TEMPLATE + "/diff", a=1, b=2).json()
    assert changes == [{"path": "tools[0]", "op": "added", "old": None,
                        "new": {"name": "calculator", "description": "",
                                "parameters": {"type": "object", "properties": {}}}}]


def test_instances_page_through_every_key_once(api, project, owner, registry):
    version_publish(project=project, kind="task_template", slug="add-two", spec=TEMPLATE_SPEC, author=owner,
                    instances=addition_instances(53))
    seen, after, pages = [], None, 0
    while True:
        query = {"limit": 10} | ({"after": after} if after else {})
        page = api.get(TEMPLATE + "/versions/latest/instances", **query).json()
        pages += 1
        seen += [item["key"] for item in page["items"]]
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert pages == 6
    assert seen == sorted(seen) == [f"add-{i:05d}" for i in range(53)]
    first = api.get(TEMPLATE + "/versions/2/instances", limit=1).json()["items"][0]
    assert (first["inputs"], first["hidden"]) == ({"a": 0, "b": 0}, {"answer": 0})
    assert len(first["content_hash"]) == 64


def test_instances_of_an_older_version_are_its_own(api, project, owner, registry):
    version_publish(project=project, kind="task_template", slug="add-two", spec=TEMPLATE_SPEC, author=owner,
                    instances=addition_instances(3))
    assert len(api.get(TEMPLATE + "/versions/1/instances", limit=1000).json()["items"]) == 20
    assert len(api.get(TEMPLATE + "/versions/2/instances", limit=1000).json()["items"]) == 3


def test_instances_of_a_kind_without_instances_is_404(api):
    # The endpoint exists for task templates only; other kinds match no endpoint.
    assert api.get(VERIFIER + "/versions/1/instances").status_code == 404


def test_aliases_list_and_move(api_as, owner, api, verifier_history):
    assert [(a["name"], a["version"]) for a in api.get(VERIFIER + "/aliases").json()] == [("prod", 3)]
    moved = api_as(owner).put(VERIFIER + "/aliases/prod", {"version": 5})
    assert moved.status_code == 200 and moved.json()["version"] == 5
    assert api.get(VERIFIER + "/versions/prod").json()["number"] == 5
    api_as(owner).put(VERIFIER + "/aliases/canary", {"version": 1})
    assert [(a["name"], a["version"]) for a in api.get(VERIFIER + "/aliases").json()] == [("canary", 1), ("prod", 5)]


def test_bundle_returns_pinned_members_and_resolved_closure(api, registry):
    bundle = api.get("/projects/acme-rl/bundles/arith-bundle/versions/latest").json()
    assert bundle["ref"] == "bundle/arith-bundle@1"
    assert bundle["members"] == ["domain/arithmetic@1"]
    assert bundle["resolved"] == [{"ref": v.ref, "content_hash": v.content_hash} for v in sorted(
        (registry[k] for k in ("domain", "sandbox_image", "task_template", "verifier")),
        key=lambda v: (v.definition.kind, v.definition.slug))]
    assert bundle["spec"]["resolved"] == bundle["resolved"]


def test_bundle_keeps_its_pins_when_members_move_on(api, project, owner, registry):
    version_publish(project=project, kind="verifier", slug="numeric", author=owner,
                    spec={**VERIFIER_SPEC, "pass_threshold": 0.5})
    resolved = {m["ref"] for m in api.get("/projects/acme-rl/bundles/arith-bundle/versions/1").json()["resolved"]}
    assert "verifier/numeric@1" in resolved and "verifier/numeric@2" not in resolved


def test_bundle_endpoint_only_serves_bundles(api):
    response = api.get("/projects/acme-rl/bundles/arithmetic/versions/1")
    assert response.status_code == 404
    assert response.json()["detail"] == "No bundle named 'arithmetic' in project 'acme-rl'."


def test_lists_cost_the_same_queries_whatever_their_length(api, verifier_history):
    def queries(path, **query):
        with CaptureQueriesContext(connection) as captured:
            assert api.get(path, **query).status_code == 200
        return len(captured)

    queries("/projects")  # the token's first use of the minute records last_used_at; compare the calls after it
    assert queries(VERIFIER + "/versions", limit=1) == queries(VERIFIER + "/versions", limit=5)
    assert queries(VERIFIER) == queries(DEFINITIONS + "/domain/arithmetic")
    assert queries(TEMPLATE + "/versions/1/instances", limit=1) == queries(TEMPLATE + "/versions/1/instances",
                                                                          limit=20)
