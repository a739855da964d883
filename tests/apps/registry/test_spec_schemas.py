"""The JSON Schemas of the specs, served by the API: every spec the demo seeds validates against its kind's
schema, and a spec missing what its kind requires does not."""

import jsonschema

from apps.demo.seed import drafts


def test_the_served_schemas_validate_every_demo_spec(api_as, owner, project):
    api = api_as(owner)
    served = api.get("/schemas")
    assert served.status_code == 200
    schemas = served.json()["kinds"]
    assert set(schemas) == {"domain", "task_template", "sandbox_image", "verifier", "bundle", "model", "rubric",
                            "dataset"}
    seeded = drafts()
    assert {draft.kind for draft in seeded} == set(schemas) - {"dataset"}  # a dataset is built, not drafted
    for draft in seeded:
        jsonschema.Draft202012Validator(schemas[draft.kind]).validate(draft.spec)
    verifier = api.get("/schemas/verifier").json()
    assert verifier == schemas["verifier"] and verifier["x-schema-version"] == served.json()["schema_version"]
    errors = list(jsonschema.Draft202012Validator(verifier).iter_errors({"pass_threshold": 1.0}))
    assert any("'layers' is a required property" in error.message for error in errors)
    assert api.get("/schemas/widget").status_code == 422


def test_a_bundles_run_config_is_described_field_by_field(api_as, owner, project):
    bundle = jsonschema.Draft202012Validator(api_as(owner).get("/schemas/bundle").json())
    members = {"members": ["domain/arithmetic@latest"]}
    assert bundle.is_valid({**members, "run_config": {"group_size": 4, "learning_rate": 1e-4}})
    assert not bundle.is_valid({**members, "run_config": {"group_sise": 4}})  # a typo is not a field
    assert not bundle.is_valid({**members, "run_config": {"group_size": 1}})  # GRPO compares at least 2
    assert not bundle.is_valid({**members, "run_config": {"model_sha256": "0" * 64}})  # the studio sets it
    group_size = bundle.schema["properties"]["run_config"]["properties"]["group_size"]
    assert group_size["default"] == 8 and group_size["description"]


def test_the_sandbox_images_base_layer_comes_first_and_a_rubrics_labels_fit_its_questions(api_as, owner, project):
    schemas = api_as(owner).get("/schemas").json()["kinds"]
    image = jsonschema.Draft202012Validator(schemas["sandbox_image"])
    base, packages = {"type": "base", "image": "python-3.11-slim"}, {"type": "python_packages", "packages": ["x==1"]}
    assert image.is_valid({"layers": [base, packages]}) and not image.is_valid({"layers": [packages, base]})
    rubric = jsonschema.Draft202012Validator(schemas["rubric"])
    text = {"key": "notes", "type": "text", "prompt": "Anything else?"}
    assert rubric.is_valid({"questions": [text]})
    assert not rubric.is_valid({"questions": [{**text, "labels": ["a", "b"]}]})
    assert not rubric.is_valid({"questions": [{**text, "type": "labels", "labels": ["a"]}]})
    dataset = jsonschema.Draft202012Validator(schemas["dataset"])
    built = {"format": "sft", "sources": [{"type": "reference_check", "bundle": "demo"}], "content_sha256": "a" * 64,
             "rows": 3}
    assert dataset.is_valid(built) and not dataset.is_valid({**built, "sources": [{"type": "everything"}]})
