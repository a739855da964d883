"""Issue 29's exfiltration, as an editor tried it: an endpoint at a server of theirs that names the studio's
SECRET_KEY as its API key, then an evaluation of it. Refused at create; an endpoint (or an evaluation) made before
the change is refused at run time; no request leaves with a studio secret. A server here records every
Authorization header it gets."""

import pytest
from django.conf import settings

from apps.accounts.models import AuditEvent, ProjectSecret, Role
from apps.evals.models import Endpoint
from apps.evals.services import EvalError, endpoint_create, evaluation_launch
from apps.registry.services import version_publish
from apps.runs.attempts import run_attempt
from apps.runs.models import Run, RunStatus
from apps.runs.services import RunError, run_claim, run_create
from tests.support.recording_server import RecordingServer

SUITE = {"members": ["domain/arithmetic@latest"], "evaluation": {"tasks_per_template": 2, "samples_per_task": 1}}
DECLARED = "key-the-operator-declared"


@pytest.fixture
def suite(project, registry, owner):
    return version_publish(project=project, kind="bundle", slug="tiny-suite", spec=SUITE, author=owner).version


@pytest.fixture
def editor(member):
    return member(Role.EDITOR)


@pytest.fixture
def server():
    with RecordingServer() as recording:
        yield recording


@pytest.fixture
def declared(monkeypatch):
    monkeypatch.setenv("STUDIO_ENDPOINT_KEY_OPENAI", DECLARED)
    return "operator:OPENAI"


def _carries_a_studio_secret(server: RecordingServer) -> bool:
    return any(settings.SECRET_KEY in authorization for authorization in server.authorizations())


def _run(evaluation) -> Run:
    run_attempt(run_id=evaluation.run_id, attempt=run_claim(run_id=evaluation.run_id, stale_after=0))
    return Run.objects.get(pk=evaluation.run_id)


def test_an_endpoint_naming_a_studio_secret_is_refused_at_create(project, editor, api_as, server, declared,
                                                                 egress_loopback):
    api = api_as(editor)
    path = f"/projects/{project.slug}/evals/endpoints/"
    refused = api.post(path, {"slug": "mine", "base_url": server.url + "/v1", "model": "m",
                              "api_key_env": "SECRET_KEY"})
    body = refused.json()
    assert refused.status_code == 400 and body["errors"][0]["field"] == "api_key_env", body
    assert "operator:OPENAI" in body["detail"] and "STUDIO_ENDPOINT_KEY_" in body["detail"]  # what is allowed
    for credential in ("operator:SECRET_KEY", "SECRET_KEY", "project:nope", "operator:../DATABASE_URL"):
        named = api.post(path, {"slug": "mine", "base_url": server.url + "/v1", "model": "m",
                                "credential": credential})
        assert named.status_code == 400 and named.json()["errors"][0]["field"] == "credential", named.json()
    assert not Endpoint.objects.exists()
    listed = api.get(f"/projects/{project.slug}/credentials")
    assert listed.json() == ["operator:OPENAI"] and DECLARED not in listed.content.decode()  # names only
    added = api.post(path, {"slug": "mine", "base_url": server.url + "/v1", "model": "m", "credential": declared})
    assert added.status_code == 201, added.json()
    assert server.requests == []


def test_an_endpoint_at_the_loopback_is_refused_unless_the_operator_allows_it(project, editor, api_as, server,
                                                                              settings):
    refused = api_as(editor).post(f"/projects/{project.slug}/evals/endpoints/",
                                  {"slug": "local", "base_url": server.url + "/v1", "model": "m"})
    assert refused.status_code == 400 and refused.json()["errors"][0]["field"] == "base_url"
    assert "loopback" in refused.json()["detail"] and "STUDIO_EGRESS_ALLOW" in refused.json()["detail"]
    metadata = api_as(editor).post(f"/projects/{project.slug}/evals/endpoints/",
                                   {"slug": "meta", "base_url": "http://169.254.169.254/v1", "model": "m"})
    assert metadata.status_code == 400 and "link-local" in metadata.json()["detail"]
    settings.EGRESS_ALLOW = "127.0.0.1"
    allowed = api_as(editor).post(f"/projects/{project.slug}/evals/endpoints/",
                                  {"slug": "local", "base_url": server.url + "/v1", "model": "m"})
    assert allowed.status_code == 201


def test_an_endpoint_made_before_the_change_is_refused_at_run_time_and_nothing_leaves(
        project, owner, suite, server, declared, egress_loopback, api_as):
    old = Endpoint.objects.create(project=project, slug="old", base_url=server.url + "/v1", model="m",
                                  api_key_env="SECRET_KEY")  # as the API stored it before credentials
    with pytest.raises(EvalError, match="may no longer name") as refused:
        evaluation_launch(project=project, suite=suite, actor=owner, endpoint=old)
    assert "operator:OPENAI" in str(refused.value)  # what to pick instead
    listed = api_as(owner).get(f"/projects/{project.slug}/evals/endpoints/").json()
    assert "may no longer name" in listed[0]["problem"]

    # An evaluation queued before the change pinned the variable in its plan: its attempt refuses, sending nothing.
    fixed = endpoint_create(project=project, slug="fixed", base_url=server.url + "/v1", model="m", actor=owner)
    evaluation = evaluation_launch(project=project, suite=suite, actor=owner, endpoint=fixed)
    run = evaluation.run
    run.config["evaluation"]["endpoint"] = {"base_url": server.url + "/v1", "model": "m",
                                            "api_key_env": "SECRET_KEY"}
    run.save(update_fields=["config"])
    with pytest.raises(ValueError, match="may no longer name"):
        _run(evaluation)
    failed = Run.objects.get(pk=run.pk)
    assert failed.status == RunStatus.FAILED and "nothing was sent" in failed.error
    assert server.requests == []

    # Fixed by an editor (the API's PATCH), the endpoint is evaluated with the declared key, and only that key.
    patched = api_as(owner).patch(f"/projects/{project.slug}/evals/endpoints/old", {"credential": declared})
    assert patched.status_code == 200 and patched.json()["problem"] == "", patched.json()
    done = _run(evaluation_launch(project=project, suite=suite, actor=owner, endpoint=Endpoint.objects.get(
        slug="old")))
    assert done.status == RunStatus.COMPLETED, done.error
    assert server.requests and server.authorizations() == {f"Bearer {DECLARED}"}
    assert not _carries_a_studio_secret(server)


def test_an_address_refused_since_the_launch_is_refused_at_run_time(project, owner, suite, server, settings):
    settings.EGRESS_ALLOW = "127.0.0.1"
    endpoint = endpoint_create(project=project, slug="local", base_url=server.url + "/v1", model="m", actor=owner)
    evaluation = evaluation_launch(project=project, suite=suite, actor=owner, endpoint=endpoint)
    settings.EGRESS_ALLOW = ""  # the operator withdrew the allowance before the evaluation ran
    with pytest.raises(ValueError, match="loopback"):
        _run(evaluation)
    assert "loopback" in Run.objects.get(pk=evaluation.run_id).error and server.requests == []


def test_a_project_key_is_stored_encrypted_and_never_shown_again(project, owner, editor, api_as, server, suite,
                                                                 settings, egress_loopback):
    from cryptography.fernet import Fernet

    value = "sk-project-key-0123456789"
    path = f"/projects/{project.slug}/secrets"
    admin = api_as(owner, scope="admin")  # an owner's rights: a write token (an editor's) cannot store keys
    assert api_as(owner).post(path, {"name": "prod", "value": value}).status_code == 403
    assert admin.post(path, {"name": "prod", "value": value}).status_code == 400  # no STUDIO_SECRETS_KEY
    client_page = api_as(owner).client
    client_page.force_login(owner)
    page = client_page.get(f"/p/{project.slug}/evals/").content.decode()  # which says so, offering no form
    assert "data-no-secrets-key" in page and "data-secret-form" not in page
    assert "no credential yet" in page  # the endpoint form's key selector, which offers "none" only
    settings.SECRETS_KEY = Fernet.generate_key().decode()
    assert api_as(editor).post(path, {"name": "prod", "value": value}).status_code == 403  # owners only
    stored = admin.post(path, {"name": "prod", "value": value})
    assert stored.status_code == 201 and stored.json() == {"credential": "project:prod"}
    row = ProjectSecret.objects.get(project=project, name="prod")
    assert value not in row.ciphertext
    audit = list(AuditEvent.objects.filter(project=project).values_list("action", "target", "details"))
    assert ("secret.store", "secret/prod", {}) in audit and value not in repr(audit)
    assert "project:prod" in api_as(editor).get(f"/projects/{project.slug}/credentials").json()

    endpoint = endpoint_create(project=project, slug="p", base_url=server.url + "/v1", model="m",
                               credential="project:prod", actor=owner)
    assert _run(evaluation_launch(project=project, suite=suite, actor=owner, endpoint=endpoint)).status == \
        RunStatus.COMPLETED
    assert server.authorizations() == {f"Bearer {value}"}
    page = client_page.get(f"/p/{project.slug}/evals/").content.decode()
    assert "project:prod" in page and value not in page and "data-secret-form" in page


def test_the_evals_page_adds_an_endpoint_with_a_listed_credential_and_checks_its_address(client, project, editor,
                                                                                         declared, settings):
    client.force_login(editor)
    page = client.get(f"/p/{project.slug}/evals/").content.decode()
    assert "data-endpoint-form" in page and "operator:OPENAI" in page and DECLARED not in page
    assert "the workers reach public addresses only" in page
    form = {"action": "endpoint", "endpoint-slug": "meta", "endpoint-base_url": "http://169.254.169.254/v1",
            "endpoint-model": "m", "endpoint-credential": declared}
    refused = client.post(f"/p/{project.slug}/evals/", form)
    assert refused.status_code == 400 and "link-local" in refused.content.decode()
    forged = client.post(f"/p/{project.slug}/evals/", {**form, "endpoint-base_url": "http://93.184.215.14/v1",
                                                        "endpoint-credential": "operator:SECRET_KEY"})
    assert forged.status_code == 400 and not Endpoint.objects.exists()
    added = client.post(f"/p/{project.slug}/evals/", {**form, "endpoint-base_url": "http://93.184.215.14/v1"},
                        follow=True)
    assert Endpoint.objects.get(slug="meta").credential == declared
    assert "Added endpoint/meta: 93.184.215.14 is a public address." in added.content.decode()
    # The demo's allowance of the loopback (make demo sets STUDIO_EGRESS_ALLOW): the form says what the operator
    # allows, and an address it admitted says by which entry.
    settings.EGRESS_ALLOW = "127.0.0.0/8 ::1 localhost"
    page = client.get(f"/p/{project.slug}/evals/").content.decode()
    assert "what the operator allows in STUDIO_EGRESS_ALLOW here: localhost, 127.0.0.0/8, ::1/128" in page
    local = client.post(f"/p/{project.slug}/evals/", {**form, "endpoint-slug": "local",
                                                       "endpoint-base_url": "http://127.0.0.1:8000/v1"}, follow=True)
    assert ("Added endpoint/local: 127.0.0.1 is a loopback address, admitted by 127.0.0.0/8 in STUDIO_EGRESS_ALLOW."
            in local.content.decode())


def test_inference_servers_the_operator_did_not_list_are_refused_at_create(project, registry, owner, settings):
    with pytest.raises(RunError) as refused:
        run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner,
                   overrides={"inference_servers": "http://127.0.0.1:9/v1"})
    assert refused.value.errors[0].field == "inference_servers" and "STUDIO_EGRESS_ALLOW" in str(refused.value)
    with pytest.raises(RunError, match="is not in STUDIO_EGRESS_ALLOW"):  # public is not enough: they get weights
        run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner,
                   overrides={"inference_servers": "http://93.184.215.14:8000/v1"})
    settings.EGRESS_ALLOW = "127.0.0.1"
    run_create(project=project, bundle=registry["bundle"], steps=1, actor=owner,
               overrides={"inference_servers": "http://127.0.0.1:9/v1"})
