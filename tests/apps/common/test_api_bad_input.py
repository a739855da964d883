"""Request bodies no handler should ever see: JSON nested deeper than any spec needs (deep enough to break the
recursive walks after it, or the JSON parser itself), lone surrogates (text that is not Unicode, so nothing can
store or hash it). Each answers 400 in the API's JSON shape with the reason, and nothing is published. And every
error under /api/ is JSON, a method an endpoint does not take included (405, with Allow)."""

import json

import pytest

from apps.accounts.models import AuditEvent
from apps.registry.models import Alias, Definition, TaskInstance, Version
from tests.support.api import PREFIX
from tests.support.specimens import TEMPLATE_SPEC, VERIFIER_SPEC, addition_instances

DEFINITIONS = "/projects/acme-rl/definitions"
VERIFIER = DEFINITIONS + "/verifier/numeric"
TEMPLATE = DEFINITIONS + "/task_template/add-two"
HOLE = '"__HOLE__"'  # where a test puts raw JSON text (too deep for json.dumps) into a body


def refused(response, status: int = 400) -> str:
    """The detail of a JSON error answer, after checking its status and shape."""
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"]
    assert isinstance(body["errors"], list)
    return body["detail"]


def nested(levels: int) -> str:
    """JSON text of `levels` nested objects: {"a": {"a": ... 1 ...}}."""
    return '{"a": ' * (levels - 1) + "1" + "}" * (levels - 1)


def spec_body(json_schema: str) -> str:
    """A publish body whose spec is valid but for a free-form field (a json_schema check) holding `json_schema`."""
    spec = json.loads(json.dumps(VERIFIER_SPEC))
    spec["layers"][0]["checks"].append({"type": "json_schema", "json_schema": "__HOLE__"})
    return json.dumps({"spec": spec, "message": "deep"}).replace(HOLE, json_schema)


def instances_body(inputs_a: str) -> str:
    """A task template publish body whose first instance's input `a` is the raw JSON `inputs_a`."""
    instances = addition_instances(3)
    instances[0]["inputs"]["a"] = "__HOLE__"
    return json.dumps({"spec": TEMPLATE_SPEC, "message": "deep", "instances": instances}).replace(HOLE, inputs_a)


@pytest.fixture
def api(api_as, owner, registry):
    return api_as(owner)


@pytest.fixture
def unchanged(db):
    """Assert at the end of the test that nothing was published: no version, definition, alias, task instance or
    audit row."""
    def counts():
        return tuple(model.objects.count() for model in (Version, Definition, Alias, TaskInstance, AuditEvent))

    before = counts()
    yield
    assert counts() == before


# --- nesting ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [300, 3000])
def test_a_spec_nested_too_deeply_is_400(api, unchanged, levels):
    detail = refused(api.post(VERIFIER + "/versions", spec_body(nested(levels))))
    assert "nested deeper than 64 levels" in detail


@pytest.mark.parametrize("levels", [300, 3000])
def test_task_inputs_nested_too_deeply_are_400(api, unchanged, levels):
    detail = refused(api.post(TEMPLATE + "/versions", instances_body(nested(levels))))
    assert "nested deeper than 64 levels" in detail


def test_the_reason_names_where_the_deep_value_is(api, unchanged):
    detail = refused(api.post(TEMPLATE + "/versions", instances_body(nested(300))))
    assert detail.startswith("The request body is refused: body.instances[0].inputs.a.a"), detail


# --- lone surrogates ----------------------------------------------------------------------------------------


def surrogate_bodies():
    spec = json.loads(json.dumps(VERIFIER_SPEC))
    keyed = json.loads(json.dumps(VERIFIER_SPEC))
    keyed["layers"][0]["checks"].append({"type": "json_schema", "json_schema": {"\ud800": 1}})
    instances = addition_instances(3)
    instances[1]["inputs"]["a"] = "one \ud800 two"
    return {
        "description": (VERIFIER, {"spec": {**spec, "pass_threshold": 0.5}, "message": "m", "description": "\ud800"}),
        "description of a new definition": (DEFINITIONS + "/verifier/fresh",
                                            {"spec": spec, "message": "m", "description": "x\ud800"}),
        "message": (VERIFIER, {"spec": {**spec, "pass_threshold": 0.5}, "message": "fix \ud800"}),
        "task input": (TEMPLATE, {"spec": TEMPLATE_SPEC, "message": "m", "instances": instances}),
        "task key": (TEMPLATE, {"spec": TEMPLATE_SPEC, "message": "m",
                                "instances": [{**addition_instances(1)[0], "key": "k\udfff"}]}),
        "spec key": (VERIFIER, {"spec": keyed, "message": "m"}),
    }


@pytest.mark.parametrize("where", list(surrogate_bodies()))
def test_a_lone_surrogate_is_400(api, unchanged, where):
    path, body = surrogate_bodies()[where]
    text = json.dumps(body)  # ensure_ascii: the surrogate travels as the escape \ud800 (or \udfff)
    assert "\\ud800" in text or "\\udfff" in text
    detail = refused(api.post(path + "/versions", text))
    assert "lone surrogate" in detail and "not Unicode text" in detail


def test_a_lone_surrogate_in_an_alias_body_is_400(api, unchanged):
    response = api.put(VERIFIER + "/aliases/prod", '{"version": 1, "x": "\\ud800"}')
    assert "lone surrogate" in refused(response)


# --- methods ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method, path, allowed", [
    ("delete", "/projects", "GET"),
    ("put", "/projects", "GET"),
    ("patch", "/projects/acme-rl/definitions", "GET"),
    ("delete", "/projects/acme-rl/definitions/verifier/numeric/versions", "GET, POST"),
])
def test_a_method_an_endpoint_does_not_take_is_405_in_json_with_allow(api, method, path, allowed):
    response = getattr(api.client, method)(PREFIX + path, **api.headers)
    detail = refused(response, 405)
    assert sorted(response["Allow"].split(", ")) == sorted(allowed.split(", "))
    assert detail == f"{method.upper()} is not allowed on {PREFIX}{path}; it takes {response['Allow']}."


# --- every error is JSON ------------------------------------------------------------------------------------


def test_every_api_error_is_json(client, api, token_for, owner, outsider, settings):
    read_only = {"HTTP_AUTHORIZATION": f"Bearer {token_for(owner, scope='read')}"}
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    answers = {
        "no token": (client.get(PREFIX + "/projects"), 401),
        "unknown token": (client.get(PREFIX + "/projects", HTTP_AUTHORIZATION="Bearer pts_nope"), 401),
        "read scope writing": (client.post(PREFIX + VERIFIER + "/versions", json.dumps(
            {"spec": VERIFIER_SPEC, "message": "m"}), content_type="application/json", **read_only), 403),
        "another project": (api.get("/projects/other-team/definitions"), 404),
        "no endpoint": (api.get("/no/such/endpoint"), 404),
        "outside v1": (client.get("/api/v2/projects", **api.headers), 404),
        "the api root": (client.get("/api/", **api.headers), 404),
        "method": (api.client.delete(PREFIX + "/projects", **api.headers), 405),
        "malformed JSON": (api.post(VERIFIER + "/versions", "{nope"), 400),
        "not UTF-8": (api.post(VERIFIER + "/versions", b'{"message": "\xff\xfe"}'), 400),
        "too large": (api.post(VERIFIER + "/versions", json.dumps({"spec": {}, "message": "x" * 4096})), 413),
        "invalid": (api.get(VERIFIER + "/versions", limit="ten"), 422),
    }
    for name, (response, status) in answers.items():
        assert response.status_code == status, (name, response.status_code, response.content[:300])
        assert response["Content-Type"].startswith("application/json"), (name, response["Content-Type"])
        assert isinstance(response.json()["detail"], str), name
