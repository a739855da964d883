"""The runs part of the REST API (apps/runs/api.py) with the run pages' roles: any member's token reads runs,
their metrics and events; an editor's write token starts, pauses, resumes and cancels them (audit rows via
"api", with the project); another project's run is as absent as one that does not exist. And the README's
claim: a run can be started, paused, resumed and cancelled from the API."""

import pytest

from apps.accounts.models import AuditEvent, Project
from apps.registry.services import version_publish
from apps.runs.models import Run, RunEvent, RunRequest, RunStatus
from apps.runs.services import run_create, run_event_record
from tests.support.specimens import DOMAIN_SPEC

RUNS = "/projects/acme-rl/runs"


@pytest.fixture
def editor_api(api_as, member, project):
    return api_as(member("editor"), project=project, scope="write")


@pytest.fixture
def viewer_api(api_as, member, project):
    return api_as(member("viewer"), project=project, scope="read")


def start(api, **body):
    return api.post(RUNS, {"bundle": "arith-bundle", "steps": 5, **body})


def steer(api, run_id, action):
    return api.post(f"{RUNS}/{run_id}/{action}", {})


def detail(response) -> str:
    assert response["Content-Type"].startswith("application/json"), response
    return response.json()["detail"]


# --- reading ---------------------------------------------------------------------------------------------------

def test_a_viewers_read_token_reads_runs_metrics_and_events(viewer_api, studio_run):
    run, _ = studio_run
    listed = viewer_api.get(RUNS)
    assert listed.status_code == 200
    assert [(r["id"], r["status"], r["step"], r["bundle"]) for r in listed.json()] == \
        [(str(run.pk), "running", 30, "bundle/arith-bundle@1")]
    one = viewer_api.get(f"{RUNS}/{run.pk}").json()
    assert one["name"] == "live-run" and one["steps_total"] == 100 and one["config"]["group_size"] >= 2
    assert one["config_hash"] == run.config_hash
    assert viewer_api.get(f"{RUNS}/{run.pk}/metrics").json()["last_step"] == 30
    assert [e["kind"] for e in viewer_api.get(f"{RUNS}/{run.pk}/events").json()] == ["created", "started"]


def test_runs_are_listed_newest_first_and_filtered_by_status(editor_api, studio_run, project, registry, owner):
    running, _ = studio_run
    queued = run_create(project=project, bundle=registry["bundle"], steps=3, name="later", actor=owner)
    assert [r["name"] for r in editor_api.get(RUNS).json()] == ["later", "live-run"]
    assert [r["id"] for r in editor_api.get(RUNS, status="queued").json()] == [str(queued.pk)]
    assert [r["id"] for r in editor_api.get(RUNS, status="running").json()] == [str(running.pk)]
    assert editor_api.get(RUNS, limit=1).json()[0]["name"] == "later"
    bad = editor_api.get(RUNS, status="sleeping")
    assert bad.status_code == 422 and "status" in detail(bad)


def test_metrics_are_filtered_by_name_and_step(viewer_api, studio_run):
    run, _ = studio_run
    url = f"{RUNS}/{run.pk}/metrics"
    every = viewer_api.get(url).json()["series"]
    assert {"reward/mean", "policy/kl", "throughput/tokens_per_second"} <= set(every)

    one = viewer_api.get(url, names="reward/mean").json()
    assert set(one["series"]) == {"reward/mean"} and one["bucket"] == 1
    assert one["series"]["reward/mean"]["step"] == list(range(1, 31))
    assert one["series"]["reward/mean"]["value"] == every["reward/mean"]["value"]

    two = viewer_api.get(url, names=["reward/mean", "policy/kl"]).json()
    assert set(two["series"]) == {"reward/mean", "policy/kl"}

    later = viewer_api.get(url, names="reward/mean", after_step=25).json()
    assert later["series"]["reward/mean"]["step"] == [26, 27, 28, 29, 30] and later["last_step"] == 30

    assert viewer_api.get(url, names="no/such-metric").json()["series"] == {}
    assert viewer_api.get(url, after_step=30).json() == {"series": {}, "last_step": 30, "bucket": 1}
    assert viewer_api.get(url, after_step=-1).status_code == 422


def test_events_after_an_id_are_the_later_ones_oldest_first(viewer_api, studio_run):
    run, attempt = studio_run
    for n in range(3):
        run_event_record(run_id=run.pk, attempt=attempt, kind="retry", message=f"sandbox retry {n}", step=30)
    events = viewer_api.get(f"{RUNS}/{run.pk}/events").json()
    assert [e["kind"] for e in events] == ["created", "started", "retry", "retry", "retry"]
    ids = [e["id"] for e in events]
    assert ids == sorted(ids)
    after = viewer_api.get(f"{RUNS}/{run.pk}/events", after=ids[2]).json()
    assert [e["message"] for e in after] == ["sandbox retry 1", "sandbox retry 2"]
    assert viewer_api.get(f"{RUNS}/{run.pk}/events", after=ids[-1]).json() == []


# --- who may do what ---------------------------------------------------------------------------------------------

def test_a_viewer_reads_but_cannot_start_or_steer(viewer_api, studio_run):
    run, _ = studio_run
    refused = start(viewer_api)
    assert refused.status_code == 403 and "this needs editor" in detail(refused)
    for action in ("pause", "cancel"):
        assert steer(viewer_api, run.pk, action).status_code == 403
    run.refresh_from_db()
    assert Run.objects.count() == 1 and run.requested == RunRequest.NONE
    assert not AuditEvent.objects.filter(action__in=["run.create", "run.pause", "run.cancel"], via="api").exists()


def test_an_editors_read_token_cannot_start_a_run(api_as, member, project, registry):
    api = api_as(member("editor"), project=project, scope="read")
    refused = start(api)
    assert refused.status_code == 403 and "scope is read" in detail(refused)
    assert not Run.objects.exists()


def test_an_editors_write_token_starts_a_queued_run_with_an_audit_row(editor_api, project, registry):
    response = start(editor_api, name="from-the-api", config={"group_size": 4, "seed": 7})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "queued" and body["step"] == 0 and body["steps_total"] == 5 and body["attempt"] == 0
    assert body["bundle"] == "bundle/arith-bundle@1" and body["name"] == "from-the-api"
    assert body["config"]["group_size"] == 4 and body["config"]["seed"] == 7 and len(body["config_hash"]) == 64
    run = Run.objects.get(pk=body["id"])
    assert run.status == RunStatus.QUEUED and run.created_by.username == "editor-user" and run.project == project
    audit = AuditEvent.objects.get(action="run.create")
    assert (audit.via, audit.project, audit.actor, audit.target) == ("api", project, run.created_by, f"run/{run.pk}")
    assert audit.details["bundle"] == "bundle/arith-bundle@1" and audit.details["steps"] == 5


def test_a_bundle_is_named_by_number_alias_or_latest(editor_api, project, registry, owner):
    version_publish(project=project, kind="domain", slug="arithmetic", author=owner,
                    spec={**DOMAIN_SPEC, "sampling_weight": 3.0})
    version_publish(project=project, kind="bundle", slug="arith-bundle", author=owner,
                    spec={"members": ["domain/arithmetic@latest"]})  # version 2: pins the domain's version 2
    for ref, pinned in (("arith-bundle@1", 1), ("arith-bundle@latest", 2), ("arith-bundle", 2)):
        response = editor_api.post(RUNS, {"bundle": ref, "steps": 1})
        assert response.status_code == 201, (ref, response.content)
        assert response.json()["bundle"] == f"bundle/arith-bundle@{pinned}", ref


def test_a_config_out_of_bounds_is_400_naming_the_field(editor_api, registry):
    for config, field in (({"group_size": 1e9}, "group_size"), ({"group_size": 10**9}, "group_size"),
                          ({"rollout_concurrency": 10**6}, "rollout_concurrency"),
                          ({"device": "cuda;rm -rf"}, "device"), ({"model": "/etc"}, "model"),
                          ({"no_such_knob": 1}, "no_such_knob")):
        response = start(editor_api, config=config)
        assert response.status_code == 400, (config, response.content)
        assert detail(response).startswith(f"config: {field}"), detail(response)
        assert field in [e["field"] for e in response.json()["errors"]], response.json()
    assert not Run.objects.exists()


def test_a_setting_of_another_kind_is_400_at_that_setting_naming_the_kind_that_has_it(editor_api, registry):
    response = start(editor_api, kind="sft", config={"dataset": "dataset/chats@1", "group_size": 4})
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == [
        {"field": "group_size", "problem": "group_size is a GRPO setting; an SFT run does not use it"}]
    response = start(editor_api, config={"batch_size": 4, "dpo_beta": 0.2})
    assert [e["problem"] for e in response.json()["errors"]] == [
        "batch_size is an SFT and DPO setting; a GRPO run does not use it",
        "dpo_beta is a DPO setting; a GRPO run does not use it"]
    assert not Run.objects.exists()


def test_steps_out_of_range_and_unknown_fields_are_422_naming_them(editor_api, registry):
    for body, field in (({"steps": 0}, "steps"), ({"steps": 10**7}, "steps"), ({"colour": "red"}, "colour"),
                        ({"bundle": "../etc"}, "bundle")):
        response = start(editor_api, **body)
        assert response.status_code == 422, (body, response.content)
        assert field in [e["field"] for e in response.json()["errors"]], response.json()
    assert not Run.objects.exists()


def test_an_unknown_bundle_is_404(editor_api, registry):
    for ref in ("no-such-bundle", "arith-bundle@7", "arith-bundle@prod", "numeric"):  # numeric: a verifier
        response = start(editor_api, bundle=ref)
        assert response.status_code == 404, (ref, response.content)
        assert detail(response)
    assert not Run.objects.exists()


def test_another_projects_run_is_404_whatever_the_path(editor_api, outsider, registry):
    theirs = Project.objects.get(slug="other-team")  # the outsider's
    bundle = _their_bundle(theirs, outsider)
    run = run_create(project=theirs, bundle=bundle, steps=3, actor=outsider)
    for path in (f"{RUNS}/{run.pk}", f"{RUNS}/{run.pk}/metrics", f"{RUNS}/{run.pk}/events",
                 f"/projects/other-team/runs/{run.pk}", "/projects/other-team/runs"):
        response = editor_api.get(path)
        assert response.status_code == 404, path
        assert run.name not in response.content.decode()
    for action in ("pause", "cancel"):
        assert steer(editor_api, run.pk, action).status_code == 404
    assert start(editor_api, bundle="their-bundle").status_code == 404  # their bundle is not ours to pin
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and not AuditEvent.objects.filter(action__startswith="run.", via="api")


def _their_bundle(project, owner):
    from tests.support.specimens import IMAGE_SPEC, TEMPLATE_SPEC, VERIFIER_SPEC, addition_instances

    def publish(kind, slug, spec, **extra):
        return version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner, **extra).version

    publish("sandbox_image", "py-basic", IMAGE_SPEC)
    publish("verifier", "numeric", VERIFIER_SPEC)
    publish("task_template", "add-two", TEMPLATE_SPEC, instances=addition_instances(3))
    publish("domain", "arithmetic", DOMAIN_SPEC)
    return publish("bundle", "their-bundle", {"members": ["domain/arithmetic@latest"]})


def test_a_run_id_that_is_not_a_uuid_is_422_and_an_unknown_one_404(editor_api, registry):
    assert editor_api.get(f"{RUNS}/not-a-uuid").status_code == 422
    assert editor_api.get(f"{RUNS}/00000000-0000-4000-8000-000000000000").status_code == 404
    assert steer(editor_api, "00000000-0000-4000-8000-000000000000", "cancel").status_code == 404


# --- steering: the README's claim ---------------------------------------------------------------------------------

def test_start_pause_resume_and_cancel_a_run_from_the_api(editor_api, registry):
    # The README: "start, pause, resume and cancel from the page, the API or the CLI".
    run_id = _started(editor_api)
    paused = steer(editor_api, run_id, "pause")
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    resumed = steer(editor_api, run_id, "resume")
    assert resumed.status_code == 200 and resumed.json()["status"] == "queued"
    cancelled = steer(editor_api, run_id, "cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert editor_api.get(f"{RUNS}/{run_id}").json()["finished_at"] is not None

    actions = list(AuditEvent.objects.filter(target=f"run/{run_id}").order_by("id").values_list("action", "via"))
    assert actions == [("run.create", "api"), ("run.pause", "api"), ("run.resume", "api"), ("run.cancel", "api")]
    assert set(AuditEvent.objects.filter(target=f"run/{run_id}").values_list("project__slug", flat=True)) == \
        {"acme-rl"}
    kinds = [e["kind"] for e in editor_api.get(f"{RUNS}/{run_id}/events").json()]
    assert kinds == ["created", "paused", "requested", "cancelled"]


def _started(api) -> str:
    response = start(api)
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_a_running_run_is_asked_and_its_worker_decides(editor_api, studio_run):
    run, _ = studio_run
    asked = steer(editor_api, run.pk, "pause")
    assert asked.status_code == 200 and asked.json()["status"] == "running" and asked.json()["requested"] == "pause"
    asked = steer(editor_api, run.pk, "cancel")
    assert asked.status_code == 200 and asked.json()["requested"] == "cancel"
    refused = steer(editor_api, run.pk, "resume")
    assert refused.status_code == 409
    assert detail(refused) == "only a paused or interrupted run can be resumed; this one is running"
    assert RunEvent.objects.filter(run=run, kind="requested").count() == 2


def test_cancel_then_resume_is_409_with_the_reason(editor_api, registry):
    run_id = _started(editor_api)
    assert steer(editor_api, run_id, "cancel").json()["status"] == "cancelled"
    resumed = steer(editor_api, run_id, "resume")
    assert resumed.status_code == 409
    assert detail(resumed) == "only a paused or interrupted run can be resumed; this one is cancelled"
    assert resumed.json()["errors"] == []
    again = steer(editor_api, run_id, "cancel")
    assert again.status_code == 409 and detail(again) == "the run is already cancelled"
    paused = steer(editor_api, run_id, "pause")
    assert paused.status_code == 409 and detail(paused) == "a cancelled run cannot be paused"
    assert Run.objects.get(pk=run_id).status == RunStatus.CANCELLED
    assert AuditEvent.objects.filter(target=f"run/{run_id}", action="run.resume").count() == 0


def test_an_unknown_action_is_not_an_action(editor_api, registry):
    run_id = _started(editor_api)
    for action in ("explode", "delete", "PAUSE"):
        response = steer(editor_api, run_id, action)
        assert response.status_code in (404, 405, 422), (action, response.status_code)
        assert response["Content-Type"].startswith("application/json")
    assert Run.objects.get(pk=run_id).status == RunStatus.QUEUED
