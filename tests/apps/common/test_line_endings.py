"""Text enters the studio with one line ending, "\\n", whatever wrote it: a browser submits every textarea with
"\\r\\n", and an API client or a file written on Windows may carry them too. Stored text, and every parser that
later reads it, sees "\\n" only."""

from django.urls import reverse

from apps.registry.files import dump_yaml
from apps.registry.models import Definition, Version
from tests.support.specimens import TEMPLATE_SPEC, addition_instances

TEMPLATE = "/projects/acme-rl/definitions/task_template/add-two"


def test_a_textarea_submitted_by_a_browser_is_stored_with_newlines(login, member, project, registry):
    spec = {"layers": [{"type": "base", "image": "python-3.12"}]}
    page = login(member("editor")).post(reverse("registry:definition_create", kwargs={"project": project.slug}), {
        "kind": "sandbox_image", "slug": "py-next", "description": "Newer Python.\r\nFor the 3.12 tasks.",
        "spec": dump_yaml(spec).replace("\n", "\r\n"), "message": "First version"})
    assert page.status_code == 302
    definition = Definition.objects.get(kind="sandbox_image", slug="py-next")
    assert definition.description == "Newer Python.\nFor the 3.12 tasks."


def test_an_api_body_is_stored_with_newlines(api_as, owner, registry):
    instances = addition_instances(2)
    instances[0]["hidden"]["worked"] = "0 + 0\r\n= 0\r"
    body = {"spec": {**TEMPLATE_SPEC, "prompt_template": "What is {a} + {b}?\r\nAnswer with the number."},
            "message": "Ask for the number alone.\r\nThe tiny model rambles.", "instances": instances}
    response = api_as(owner).post(TEMPLATE + "/versions", body)
    assert response.status_code == 201, response.content[:500]
    version = Version.objects.get(definition__slug="add-two", number=2)
    assert version.message == "Ask for the number alone.\nThe tiny model rambles."
    assert version.spec["prompt_template"] == "What is {a} + {b}?\nAnswer with the number."
    stored = version.instance_set.members.select_related("instance").get(key="add-00000").instance
    assert stored.hidden["worked"] == "0 + 0\n= 0\n"
