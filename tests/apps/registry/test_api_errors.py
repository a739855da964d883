"""Every bad request gets a 4xx JSON answer that names what was wrong; nothing reaches a 500 or an HTML page."""

import json

import pytest

from apps.registry.models import Alias, Definition, Version
from tests.support.specimens import TEMPLATE_SPEC, VERIFIER_SPEC, addition_instances

DEFINITIONS = "/projects/acme-rl/definitions"
VERIFIER = DEFINITIONS + "/verifier/numeric"
LOOSER = {**VERIFIER_SPEC, "pass_threshold": 0.5}


def problems(response, status: int) -> dict[str, str]:
    """The JSON error body's problems by field, after checking the status and the shape."""
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"]
    return {e["field"]: e["problem"] for e in body["errors"]}


@pytest.fixture
def api(api_as, owner, registry):
    return api_as(owner)


@pytest.fixture
def unchanged(db):
    """Assert at the end of the test that no version, definition or alias was written."""
    before = Version.objects.count(), Definition.objects.count(), Alias.objects.count()
    yield
    assert (Version.objects.count(), Definition.objects.count(), Alias.objects.count()) == before


# --- request bodies ---------------------------------------------------------------------------------------


def test_unknown_body_field(api, unchanged):
    found = problems(api.post(VERIFIER + "/versions", {"spec": LOOSER, "message": "m", "colour": "red"}), 422)
    assert "Extra inputs are not permitted" in found["colour"]


def test_unknown_spec_field(api, unchanged):
    response = api.post(VERIFIER + "/versions", {"spec": {**VERIFIER_SPEC, "pass_treshold": 0.5}, "message": "m"})
    assert problems(response, 422) == {"pass_treshold": "unknown field; the fields here are layers, pass_threshold"}


def test_nested_spec_problem_names_its_path(api, unchanged):
    spec = json.loads(json.dumps(VERIFIER_SPEC))
    spec["layers"][0]["checks"][0]["abs_tolerance"] = -1
    found = problems(api.post(VERIFIER + "/versions", {"spec": spec, "message": "m"}), 422)
    assert "greater than or equal to 0" in found["layers[0].checks[0].abs_tolerance"]


def test_wrong_types(api, unchanged):
    response = api.post(VERIFIER + "/versions", {"spec": "layers: []", "message": 5, "expected_head": "one"})
    found = problems(response, 422)
    assert "valid dictionary" in found["spec"]
    assert "valid string" in found["message"]
    assert "valid integer" in found["expected_head"]
    assert "spec" in response.json()["detail"] and "expected_head" in response.json()["detail"]


def test_missing_message(api, unchanged):
    assert problems(api.post(VERIFIER + "/versions", {"spec": LOOSER}), 422) == {"message": "Field required"}


def test_body_that_is_not_an_object(api, unchanged):
    found = problems(api.post(VERIFIER + "/versions", [LOOSER]), 422)
    assert list(found) == ["body"]


def test_missing_body(api, unchanged):
    assert "body" in problems(api.post(VERIFIER + "/versions", ""), 422)


def test_malformed_json(api, unchanged):
    response = api.post(VERIFIER + "/versions", '{"spec": {"layers": [}, "message": "m"}')
    problems(response, 400)
    assert response.json()["detail"].startswith("The request body is not valid JSON: Expecting value: line 1")


def test_json_nested_too_deeply(api, unchanged):
    response = api.post(VERIFIER + "/versions", '{"spec": ' + '{"a": ' * 100_000 + "1" + "}" * 100_001)
    problems(response, 400)
    assert "nested deeper than 64 levels" in response.json()["detail"]


def test_nan_which_json_cannot_carry(api, unchanged):
    spec = json.loads(json.dumps(VERIFIER_SPEC))
    spec["layers"][0]["checks"].append({"type": "json_schema", "json_schema": {"maximum": "NAN"}})
    response = api.post(VERIFIER + "/versions", json.dumps({"spec": spec, "message": "m"}).replace('"NAN"', "NaN"))
    problems(response, 400)  # refused with the body, before any field is validated
    assert "body.spec.layers[0].checks[1].json_schema.maximum holds NaN" in response.json()["detail"]


def test_body_above_the_upload_limit_is_413(api, unchanged, settings):
    body = json.dumps({"spec": LOOSER, "message": "x" * (10 * 2**20)})
    response = api.post(VERIFIER + "/versions", body)
    problems(response, 413)
    assert "10.0 MiB; the limit is 4 MiB" in response.json()["detail"]


def test_spec_above_the_spec_limit_is_422(api, unchanged):
    spec = {**VERIFIER_SPEC, "layers": [{**VERIFIER_SPEC["layers"][0], "name": "exact"}, {
        **VERIFIER_SPEC["layers"][1], "checks": [{**VERIFIER_SPEC["layers"][1]["checks"][0],
                                                  "rubric": "r" * 1_500_000}]}]}
    found = problems(api.post(VERIFIER + "/versions", {"spec": spec, "message": "m"}), 422)
    assert "the limit is 1 MB" in found["spec"]


def test_instances_on_a_kind_without_instances(api, unchanged):
    response = api.post(VERIFIER + "/versions", {"spec": LOOSER, "message": "m",
                                                 "instances": addition_instances(1)})
    # A verifier's publish body has no `instances` field (its schema says so), so it is refused as unknown.
    assert "not permitted" in problems(response, 422)["instances"]


def test_instance_problems_name_the_instance(api, unchanged):
    instances = addition_instances(3)
    instances[1] = {"key": "add-00001", "inputs": {"a": 1}}
    instances[2]["colour"] = "red"
    response = api.post(DEFINITIONS + "/task_template/add-two/versions",
                        {"spec": TEMPLATE_SPEC, "message": "m", "instances": instances})
    found = problems(response, 422)
    assert "Extra inputs are not permitted" in found["instances[2].colour"]
    instances[2].pop("colour")
    response = api.post(DEFINITIONS + "/task_template/add-two/versions",
                        {"spec": TEMPLATE_SPEC, "message": "m", "instances": instances})
    assert problems(response, 422) == {"instances[1].inputs": "missing b (used by prompt_template)"}


def test_reference_to_a_missing_definition(api, unchanged):
    spec = {**TEMPLATE_SPEC, "verifier": "no-such-verifier"}
    # Well formed but naming nothing: 404 like an unknown id in a path (a fuzzer's schema-valid body is not refused
    # as malformed), with the field that names it.
    found = problems(api.post(DEFINITIONS + "/task_template/add-two/versions", {"spec": spec, "message": "m"}), 404)
    assert found == {"verifier": "No verifier named 'no-such-verifier' in project 'acme-rl'."}


def test_bundle_member_that_names_nothing(api, unchanged):
    response = api.post(DEFINITIONS + "/bundle/arith-bundle/versions",
                        {"spec": {"members": ["domain/arithmetic@7"]}, "message": "m"})
    assert "versions 1..1" in problems(response, 404)["members[0]"]


def test_huge_integers_are_refused_before_the_database(api, unchanged):
    response = api.post(VERIFIER + "/versions", {"spec": LOOSER, "message": "m", "expected_head": 10**20})
    problems(response, 400)  # refused with the body, before any field is validated
    assert "body.expected_head holds an integer beyond 64 bits" in response.json()["detail"]
    assert "before" in problems(api.get(VERIFIER + "/versions", before=10**20), 422)
    assert "ref" in problems(api.get(VERIFIER + "/versions/99999999999999999999"), 422)
    alias = api.put(VERIFIER + "/aliases/prod", {"version": 10**20})
    problems(alias, 400)
    assert "body.version holds an integer beyond 64 bits" in alias.json()["detail"]


# --- paths ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("slug", ["..", "my%20slug", "Numeric", "-leading-hyphen", "a" * 64])
def test_bad_slug_in_the_path_is_422(api, unchanged, slug):
    assert "lowercase letters" in problems(api.get(f"{DEFINITIONS}/verifier/{slug}/versions"), 422)["slug"]
    published = api.post(f"{DEFINITIONS}/verifier/{slug}/versions", {"spec": VERIFIER_SPEC, "message": "m"})
    assert "lowercase letters" in problems(published, 422)["slug"]


@pytest.mark.parametrize("path", ["/verifier/a/b", "/verifier/a%2Fb", "/verifier/../../etc/passwd"])
def test_slug_with_a_slash_matches_no_endpoint(api, unchanged, path):
    for response in (api.get(DEFINITIONS + path + "/versions"),
                     api.post(DEFINITIONS + path + "/versions", {"spec": VERIFIER_SPEC, "message": "m"})):
        problems(response, 404)
        assert "No API endpoint matches" in response.json()["detail"]


def test_unknown_kind_lists_the_kinds(api, unchanged):
    for response in (api.get(DEFINITIONS + "/verifyer/numeric"),
                     api.post(DEFINITIONS + "/verifyer/numeric/versions", {"spec": LOOSER, "message": "m"}),
                     api.get(DEFINITIONS, kind="verifyer")):
        assert "'task_template'" in problems(response, 422)["kind"]


def test_missing_definition_is_404(api):
    response = api.get(DEFINITIONS + "/verifier/nope")
    problems(response, 404)
    assert response.json()["detail"] == "No verifier named 'nope' in project 'acme-rl'."


@pytest.mark.parametrize("ref, message", [
    ("7", "verifier/numeric@7 does not exist; verifier/numeric has versions 1..1."),
    ("prod", "verifier/numeric has no alias 'prod' (aliases: none)."),
])
def test_missing_version_is_404(api, ref, message):
    response = api.get(f"{VERIFIER}/versions/{ref}")
    problems(response, 404)
    assert response.json()["detail"] == message


@pytest.mark.parametrize("ref", ["0", "-1", "Prod", "v1.0"])
def test_malformed_version_reference_is_422(api, ref):
    assert "ref" in problems(api.get(f"{VERIFIER}/versions/{ref}"), 422)


def test_diff_needs_both_versions(api):
    assert problems(api.get(VERIFIER + "/diff", a=1), 422) == {"b": "Field required (query parameter)"}
    assert "99 does not exist" in api.get(VERIFIER + "/diff", a=1, b=99).json()["detail"]


@pytest.mark.parametrize("query", [{"limit": 0}, {"limit": 100_000}, {"limit": "ten"}])
def test_bad_page_size_is_422(api, query):
    assert "limit" in problems(api.get(VERIFIER + "/versions", **query), 422)
    assert "limit" in problems(api.get(DEFINITIONS + "/task_template/add-two/versions/1/instances", **query), 422)


# --- aliases ----------------------------------------------------------------------------------------------


def test_alias_to_a_missing_version(api, unchanged):
    found = problems(api.put(VERIFIER + "/aliases/prod", {"version": 5}), 404)  # an unknown id, as in a path
    assert found == {"version": "verifier/numeric@5 does not exist; verifier/numeric has versions 1..1."}


@pytest.mark.parametrize("name, problem", [
    ("latest", "'latest' always means the newest version and cannot be moved"),
    ("Prod", "an alias is lowercase letters"),
    ("9lives", "starting with a letter"),
    ("p" * 64, "at most 63 characters"),
])
def test_bad_alias_name(api, unchanged, name, problem):
    assert problem in problems(api.put(f"{VERIFIER}/aliases/{name}", {"version": 1}), 422)["name"]


def test_alias_on_a_missing_definition_is_404(api, unchanged):
    problems(api.put(DEFINITIONS + "/verifier/nope/aliases/prod", {"version": 1}), 404)


# --- everything else --------------------------------------------------------------------------------------


def test_unknown_endpoint_is_json_404(api):
    for response in (api.get("/nothing-here"), api.get("/projects/acme-rl/definitions/verifier/numeric/extra/bits"),
                     api.put("/nothing-here", {})):
        problems(response, 404)
        assert "No API endpoint matches" in response.json()["detail"]


def test_wrong_method_is_405_with_the_allowed_ones(api):
    response = api.put("/projects", {})
    assert response.status_code == 405
    assert response["Allow"] == "GET"


@pytest.mark.postgres
def test_value_the_database_cannot_store_is_400(api, unchanged):
    # PostgreSQL refuses NUL characters in text; the check happens only in the database.
    response = api.post(VERIFIER + "/versions", {"spec": LOOSER, "message": "nul \u0000 here"})
    problems(response, 400)
    assert "cannot be stored" in response.json()["detail"]
