"""Roles: viewers read, editors write, owners read the audit log; other teams cannot tell the project exists.
(Tokens here are write-scoped: the holder's role decides; scopes themselves are tests/apps/accounts.)"""

import pytest

from apps.accounts.models import AuditEvent
from apps.registry.models import Alias, Definition, Version
from tests.support.api import ApiClient
from tests.support.specimens import VERIFIER_SPEC

VERIFIER = "/projects/acme-rl/definitions/verifier/numeric"
LOOSER = {**VERIFIER_SPEC, "pass_threshold": 0.5}

READS = [
    "/projects/acme-rl/definitions",
    "/projects/acme-rl/definitions?kind=verifier",
    VERIFIER,
    VERIFIER + "/versions",
    VERIFIER + "/versions/1",
    VERIFIER + "/versions/latest",
    VERIFIER + "/diff?a=1&b=1",
    VERIFIER + "/aliases",
    "/projects/acme-rl/definitions/task_template/add-two/versions/1/instances",
    "/projects/acme-rl/bundles/arith-bundle/versions/latest",
    "/projects/acme-rl/audit",
]
WRITES = [
    ("post", VERIFIER + "/versions", {"spec": LOOSER, "message": "m"}),
    ("post", "/projects/acme-rl/definitions/verifier/brand-new/versions", {"spec": VERIFIER_SPEC, "message": "m"}),
    ("put", VERIFIER + "/aliases/prod", {"version": 1}),
]


def written():
    return Version.objects.count(), Definition.objects.count(), Alias.objects.count(), AuditEvent.objects.filter(
        action__in=["version.publish", "definition.create", "alias.move"]).count()


def test_projects_lists_only_mine_with_my_role(api_as, member, outsider, project):
    viewer = member("viewer")
    assert api_as(viewer).get("/projects").json() == [
        {"slug": "acme-rl", "name": "Acme RL", "team": "acme", "role": "viewer"}]
    # An owner's write-scoped token acts as an editor.
    assert [(p["slug"], p["role"]) for p in api_as(outsider).get("/projects").json()] == [("other-team", "editor")]


@pytest.mark.parametrize("path", READS)
def test_outsider_gets_404_on_every_read(api_as, outsider, registry, path):
    response = api_as(outsider).client.get("/api/v1" + path, **api_as(outsider).headers)
    assert response.status_code == 404
    assert response.json()["detail"] == "No project 'acme-rl'."


@pytest.mark.parametrize("method, path, body", WRITES)
def test_outsider_gets_404_on_every_write_and_nothing_is_written(api_as, outsider, registry, method, path, body):
    before = written()
    response = getattr(api_as(outsider), method)(path, body)
    assert response.status_code == 404
    assert "acme-rl" in response.json()["detail"]
    assert written() == before


@pytest.mark.parametrize("path", [p for p in READS if not p.endswith("/audit")])
def test_viewer_reads_everything_but_the_audit_log(api_as, member, registry, path):
    api = api_as(member("viewer"))
    assert api.client.get("/api/v1" + path, **api.headers).status_code == 200


@pytest.mark.parametrize("role", ["viewer", "reviewer"])
@pytest.mark.parametrize("method, path, body", WRITES)
def test_below_editor_gets_403_and_nothing_is_written(api_as, member, registry, role, method, path, body):
    api = api_as(member(role))
    before = written()
    response = getattr(api, method)(path, body)
    assert response.status_code == 403
    # The limit is the role (the token's scope is write): the 403 names it.
    assert f"Your role in 'acme-rl' is {role}; this needs editor or above." == response.json()["detail"]
    assert written() == before


def test_editor_publishes_and_moves_aliases(api_as, member, registry):
    api = api_as(member("editor"))
    assert api.post(VERIFIER + "/versions", {"spec": LOOSER, "message": "m"}).status_code == 201
    moved = api.put(VERIFIER + "/aliases/prod", {"version": 2})
    assert (moved.status_code, moved.json()["name"], moved.json()["version"]) == (200, "prod", 2)
    assert Alias.objects.get(name="prod").version.number == 2


@pytest.mark.parametrize("role", ["viewer", "reviewer", "editor"])
def test_audit_log_is_for_owners_only(api_as, member, registry, role):
    response = api_as(member(role)).get("/projects/acme-rl/audit")
    assert response.status_code == 403
    assert "needs owner" in response.json()["detail"]


def test_audit_log_is_newest_first_and_limited(api_as, client, owner, registry):
    api_as(owner).put(VERIFIER + "/aliases/prod", {"version": 1})
    # Read as the owner's browser session: a token's scope is at most an editor's.
    client.force_login(owner)
    api = ApiClient(client, None)
    events = api.get("/projects/acme-rl/audit", limit=3).json()
    assert len(events) == 3
    assert events[0] == {**events[0], "action": "alias.move", "target": "verifier/numeric@prod", "actor": "olive",
                         "via": "api", "details": {"from": None, "to": 1}}
    everything = api.get("/projects/acme-rl/audit").json()
    assert [e["created_at"] for e in everything] == sorted((e["created_at"] for e in everything), reverse=True)
    assert everything[-1]["action"] == "project.create"
    assert all(e["target"] != "project/other-team" for e in everything)
