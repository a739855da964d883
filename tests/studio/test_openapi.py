"""The served OpenAPI document: what client generators and the CLI read."""

import json


def test_openapi_document_lists_the_endpoints_and_bearer_auth(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "Posttrain Studio API"

    paths = schema["paths"]
    definition = "/api/v1/projects/{project}/definitions/{kind}/{slug}"
    assert set(paths["/api/v1/projects"]) == {"get"}
    assert definition + "/versions" not in paths  # listed and published per kind (below)
    assert "get" in paths[definition + "/versions/{ref}"]
    assert "get" in paths[definition + "/diff"]
    assert "put" in paths[definition + "/aliases/{name}"]
    assert "get" in paths["/api/v1/projects/{project}/definitions/task_template/{slug}/versions/{ref}/instances"]
    assert "get" in paths["/api/v1/projects/{project}/bundles/{slug}/versions/{ref}"]
    assert "get" in paths["/api/v1/projects/{project}/audit"]
    assert not any("{path" in p or "{rest" in p for p in paths), "the catch-all 404 route is not an endpoint"

    schemes = schema["components"]["securitySchemes"]
    assert {"type": "http", "scheme": "bearer"} in schemes.values()
    kind = next(p for p in paths[definition + "/diff"]["get"]["parameters"] if p["name"] == "kind")
    assert kind["schema"]["enum"] == ["domain", "task_template", "sandbox_image", "verifier", "bundle", "model",
                                      "rubric", "dataset"]
    assert "post" in paths[definition + "/validate"]
    review = "/api/v1/projects/{project}/review/queues/{queue}"
    assert set(paths[review + "/next"]) == {"post"} and "get" in paths[review + "/agreement"]
    assert "post" in paths[review + "/items/{item_id}/labels"]


def test_each_kind_publishes_through_an_operation_whose_body_is_that_kinds_spec(client):
    schema = json.loads(client.get("/api/v1/openapi.json").content)
    components = schema["components"]["schemas"]
    for kind in ["domain", "task_template", "sandbox_image", "verifier", "bundle", "model", "rubric", "dataset"]:
        publish = schema["paths"][f"/api/v1/projects/{{project}}/definitions/{kind}/{{slug}}/versions"]["post"]
        assert publish["operationId"] == f"publish_{kind}_version"
        listing = schema["paths"][f"/api/v1/projects/{{project}}/definitions/{kind}/{{slug}}/versions"]["get"]
        assert listing["operationId"] == f"list_{kind}_versions"
        assert {"ApiTokenAuth": []} in publish["security"]
        assert {"201", "200", "404", "409", "422"} <= set(publish["responses"])
        body = components[publish["requestBody"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]]
        spec = components[body["properties"]["spec"]["$ref"].split("/")[-1]]
        assert spec["type"] == "object" and spec["additionalProperties"] is False, kind  # not "any object"
        assert spec["required"], kind
        assert ("instances" in body["properties"]) == (kind == "task_template")
    verifier = components["VerifierSpec"]
    assert verifier["properties"]["layers"]["items"] == {"$ref": "#/components/schemas/VerifierLayer"}
    check_types = {branch["$ref"].split("/")[-1] for branch in
                   components["VerifierLayer"]["properties"]["checks"]["items"]["oneOf"]}
    assert {"StringCheck", "PythonGrader", "ScoreModel"} <= check_types


def test_openapi_document_needs_no_login(client):
    # The API authenticates per endpoint; the document itself describes no project data.
    assert client.get("/api/v1/openapi.json").status_code == 200
