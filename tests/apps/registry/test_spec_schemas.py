"""The JSON Schemas of the specs, served by the API: every spec the demo seeds validates against its kind's
schema, and a spec missing what its kind requires does not."""

import jsonschema

from apps.demo.seed import drafts


def test_the_served_schemas_validate_every_demo_spec(api_as, owner, project):
    api = api_as(owner)
    served = api.get("/schemas")
    assert served.status_code == 200
    schemas = served.json()["kinds"]
    assert set(schemas) == {"domain", "task_template", "sandbox_image", "verifier", "bundle", "model", "rubric"}
    seeded = drafts()
    assert {draft.kind for draft in seeded} == set(schemas)
    for draft in seeded:
        jsonschema.Draft202012Validator(schemas[draft.kind]).validate(draft.spec)
    verifier = api.get("/schemas/verifier").json()
    assert verifier == schemas["verifier"] and verifier["x-schema-version"] == served.json()["schema_version"]
    errors = list(jsonschema.Draft202012Validator(verifier).iter_errors({"pass_threshold": 1.0}))
    assert any("'layers' is a required property" in error.message for error in errors)
    assert api.get("/schemas/widget").status_code == 422
