"""Publishing through the API: new versions, idempotent re-publishes, stale edits, audit rows."""

from apps.accounts.models import AuditEvent
from apps.registry.models import Definition, TaskInstance, Version
from tests.support.specimens import TEMPLATE_SPEC, VERIFIER_SPEC, addition_instances

VERIFIER = "/projects/acme-rl/definitions/verifier/numeric"
TEMPLATE = "/projects/acme-rl/definitions/task_template/add-two"
LOOSER = {**VERIFIER_SPEC, "pass_threshold": 0.5}


def test_publish_creates_the_next_version_with_its_parent(api_as, owner, registry):
    response = api_as(owner).post(VERIFIER + "/versions", {"spec": LOOSER, "message": "pass at 0.5"})
    assert response.status_code == 201
    body = response.json()
    assert body["created"] is True
    version = body["version"]
    assert (version["ref"], version["number"], version["parent"]) == ("verifier/numeric@2", 2, 1)
    assert (version["kind"], version["slug"], version["message"], version["author"]) == (
        "verifier", "numeric", "pass at 0.5", "olive")
    assert version["spec"]["pass_threshold"] == 0.5
    assert version["spec"]["layers"][0]["checks"][0]["abs_tolerance"] == 0  # the normalised spec, defaults filled
    assert version["instance_count"] is None
    stored = Version.objects.get(definition__slug="numeric", number=2)
    assert version["content_hash"] == stored.content_hash and stored.parent.number == 1


def test_republishing_the_same_spec_returns_the_existing_version(api_as, owner, registry):
    api = api_as(owner)
    first = api.post(VERIFIER + "/versions", {"spec": LOOSER, "message": "pass at 0.5"})
    rows = Version.objects.count()
    again = api.post(VERIFIER + "/versions", {"spec": LOOSER, "message": "same thing again"})
    assert again.status_code == 200
    assert again.json()["created"] is False
    assert again.json()["version"]["number"] == first.json()["version"]["number"] == 2
    assert again.json()["version"]["message"] == "pass at 0.5"
    assert Version.objects.count() == rows


def test_first_publish_creates_the_definition(api_as, owner, registry):
    response = api_as(owner).post("/projects/acme-rl/definitions/verifier/strict/versions",
                                  {"spec": VERIFIER_SPEC, "message": "new", "description": "Strict numbers",
                                   "expected_head": 0})
    assert response.status_code == 201
    assert response.json()["version"]["parent"] is None
    assert Definition.objects.get(slug="strict").description == "Strict numbers"


def test_stale_expected_head_is_409_and_writes_nothing(api_as, owner, registry):
    api = api_as(owner)
    api.post(VERIFIER + "/versions", {"spec": LOOSER, "message": "someone else's edit"})
    rows = Version.objects.count()
    response = api.post(VERIFIER + "/versions", {"spec": {**VERIFIER_SPEC, "pass_threshold": 0.9},
                                                 "message": "my edit", "expected_head": 1})
    assert response.status_code == 409
    assert "@2" in response.json()["detail"] and "@1" in response.json()["detail"]
    assert Version.objects.count() == rows


def test_current_expected_head_publishes(api_as, owner, registry):
    response = api_as(owner).post(VERIFIER + "/versions", {"spec": LOOSER, "message": "m", "expected_head": 1})
    assert response.status_code == 201


def test_publish_with_instances(api_as, owner, registry):
    instances = addition_instances(30)
    response = api_as(owner).post(TEMPLATE + "/versions", {"spec": TEMPLATE_SPEC, "message": "30 instances",
                                                            "instances": instances})
    assert response.status_code == 201
    assert response.json()["version"]["instance_count"] == 30
    # the first 20 were stored by version 1 already and are shared, not copied
    assert TaskInstance.objects.filter(definition__slug="add-two").count() == 30


def test_publish_without_instances_keeps_the_previous_ones(api_as, owner, registry):
    spec = {**TEMPLATE_SPEC, "system_prompt": "Answer with a number."}
    response = api_as(owner).post(TEMPLATE + "/versions", {"spec": spec, "message": "system prompt"})
    assert response.status_code == 201
    assert response.json()["version"]["instance_count"] == 20


def test_publish_and_alias_move_are_audited_as_api(api_as, owner, registry):
    api = api_as(owner)
    api.post(VERIFIER + "/versions", {"spec": LOOSER, "message": "pass at 0.5"})
    api.put(VERIFIER + "/aliases/prod", {"version": 2})
    api.put(VERIFIER + "/aliases/prod", {"version": 1})

    publish = AuditEvent.objects.get(action="version.publish", target="verifier/numeric@2")
    assert (publish.via, publish.actor, publish.details["parent"]) == ("api", owner, 1)
    moves = list(AuditEvent.objects.filter(action="alias.move").order_by("id"))
    assert [(m.target, m.via, m.details) for m in moves] == [
        ("verifier/numeric@prod", "api", {"from": None, "to": 2}),
        ("verifier/numeric@prod", "api", {"from": 2, "to": 1}),
    ]


def test_an_identical_republish_writes_no_audit_row(api_as, owner, registry):
    api = api_as(owner)
    before = AuditEvent.objects.count()
    response = api.post(VERIFIER + "/versions", {"spec": VERIFIER_SPEC, "message": "no change"})
    assert response.status_code == 200 and response.json()["created"] is False
    assert AuditEvent.objects.count() == before
