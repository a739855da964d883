"""A sandbox image that asks for the network (limits.network: true) would share the host's network (bubblewrap's
--share-net, Docker's host mode): model-written code would reach the host's loopback services and the cloud's
metadata address. Refused when an editor publishes or validates one, and at run time for an image published
before, unless the operator allows it (STUDIO_SANDBOX_NETWORK=1)."""

from django.test import override_settings

from apps.common import wiring
from apps.registry.models import Version
from tests.support.specimens import IMAGE_SPEC
from workers.sandbox import Execution, SandboxImage, Status

IMAGES = "/projects/acme-rl/definitions/sandbox_image"
NETWORKED = {**IMAGE_SPEC, "limits": {"memory_mb": 256, "network": True}}


def _problems(response, status: int) -> dict[str, str]:
    assert response.status_code == status, response.content[:500]
    return {e["field"]: e["problem"] for e in response.json()["errors"]}


def test_an_editor_cannot_publish_or_validate_an_image_with_the_network(api_as, member, registry):
    api = api_as(member("editor"))
    before = Version.objects.count()
    for path, body, status in (("/online/versions", {"spec": NETWORKED, "message": "m"}, 422),
                               ("/online/validate", {"spec": NETWORKED}, 200)):  # validate: 200, valid false
        problems = _problems(api.post(IMAGES + path, body), status)
        assert list(problems) == ["limits.network"]
        assert "host's own services" in problems["limits.network"]
        assert "STUDIO_SANDBOX_NETWORK=1" in problems["limits.network"]
    assert Version.objects.count() == before
    assert api.post(IMAGES + "/offline/versions", {"spec": IMAGE_SPEC, "message": "m"}).status_code == 201


def test_the_operator_can_allow_it(api_as, member, registry):
    with override_settings(SANDBOX_NETWORK=True):
        response = api_as(member("editor")).post(IMAGES + "/online/versions", {"spec": NETWORKED, "message": "m"})
    assert response.status_code == 201
    assert response.json()["version"]["spec"]["limits"]["network"] is True


def test_an_image_published_before_starts_no_sandbox(api_as, owner, registry):
    with override_settings(SANDBOX_NETWORK=True):
        published = api_as(owner).post(IMAGES + "/online/versions", {"spec": NETWORKED, "message": "m"}).json()
    image = SandboxImage.from_spec(published["version"]["ref"], published["version"]["spec"])
    pool = wiring.sandbox_pool()  # the setting is off again: the backend refuses before starting anything
    try:
        result = pool.execute(image, Execution(program="print(1)"), timeout=5, retries=1)
    finally:
        pool.close()
    assert result.status == Status.INFRA_ERROR
    assert "asks for the network" in result.reason and "STUDIO_SANDBOX_NETWORK=1" in result.reason
