"""Who gets what from the live studio: a member of another project gets nothing from the pages, the JSON
endpoints, the artifact downloads, the Dash endpoints or the websocket; anonymous visitors log in first."""


import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.urls import reverse

from apps.runs.models import Run
from apps.runs.services import run_step_record
from apps.trajectories.models import Trajectory


@pytest.fixture
def urls(project, studio_run):
    run, _ = studio_run
    slug = project.slug
    coding = Trajectory.objects.filter(run=run, domain="python-coding").order_by("seq")
    solid = Trajectory.objects.filter(run=run, domain="3d-modelling").first()
    return [
        ("get", reverse("runs:run_list", kwargs={"project": slug})),
        ("get", reverse("runs:run_new", kwargs={"project": slug})),
        ("post", reverse("runs:run_new", kwargs={"project": slug})),
        ("get", reverse("runs:run_detail", kwargs={"project": slug, "run_id": run.pk})),
        ("get", reverse("runs:run_history", kwargs={"project": slug, "run_id": run.pk})),
        ("post", reverse("runs:run_control", kwargs={"project": slug, "run_id": run.pk})),
        ("get", reverse("runs:run_compare", kwargs={"project": slug}) + f"?run={run.pk}"),
        ("get", reverse("trajectories:trajectory_list", kwargs={"project": slug})),
        ("get", reverse("trajectories:trajectory_detail", kwargs={"project": slug, "trajectory_id": coding[0].pk})),
        ("get", reverse("trajectories:trajectory_compare", kwargs={"project": slug, "trajectory_id": coding[0].pk,
                                                                   "other_id": coding[1].pk})),
        ("get", reverse("trajectories:artifact", kwargs={"project": slug, "trajectory_id": solid.pk,
                                                         "name": "geometry/solid/iso.png"})),
        ("get", f"/p/{slug}/explore/"),
        ("get", f"/p/{slug}/explore/_dash-layout"),
        ("get", f"/p/{slug}/explore/_dash-dependencies"),
        ("post", f"/p/{slug}/explore/_dash-update-component"),
    ]


def test_outsider_gets_404_from_every_page_endpoint_artifact_and_dash_route(client, outsider, urls, studio_run):
    run, _ = studio_run
    client.force_login(outsider)
    for method, url in urls:
        response = getattr(client, method)(url, {"action": "cancel"} if method == "post" else None)
        assert response.status_code == 404, url
        body = b"".join(response.streaming_content) if response.streaming else response.content
        assert b"live-run" not in body and b"running_max" not in body, url
    run.refresh_from_db()
    assert run.status == "running" and run.requested == ""
    assert Run.objects.count() == 1


def test_anonymous_is_sent_to_login(client, urls):
    for method, url in urls:
        response = getattr(client, method)(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url


def test_members_read_but_only_editors_control_runs(client, member, project, studio_run):
    run, _ = studio_run
    viewer = member("viewer")
    client.force_login(viewer)
    assert client.get(reverse("runs:run_detail", kwargs={"project": project.slug, "run_id": run.pk})).status_code == 200
    control = reverse("runs:run_control", kwargs={"project": project.slug, "run_id": run.pk})
    assert client.post(control, {"action": "cancel"}).status_code == 403
    run.refresh_from_db()
    assert run.requested == ""
    assert b'value="cancel"' not in client.get(reverse("runs:run_detail", kwargs={
        "project": project.slug, "run_id": run.pk})).content


def _socket(run, cookie=None):
    from studio.asgi import application

    headers = [(b"origin", b"http://127.0.0.1")]
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, f"/ws/runs/{run.pk}/", headers=headers)


@pytest.mark.django_db(transaction=True)
def test_the_websocket_is_for_members_only(owner, outsider, session_cookie, studio_run):
    run, attempt = studio_run
    cookies = {"anonymous": None, "outsider": session_cookie(outsider), "member": session_cookie(owner)}

    def write_step():
        run_step_record(run_id=run.pk, attempt=attempt, step=31, wall_time=1.0, points={"reward/mean": 0.5},
                        trajectories=[])

    @async_to_sync
    async def scenario():
        outcome = {}
        for who in ("anonymous", "outsider"):
            communicator = _socket(run, cookies[who])
            outcome[who], _ = await communicator.connect(timeout=5)  # refused before joining the run's group
        member_socket = _socket(run, cookies["member"])
        outcome["member"], _ = await member_socket.connect(timeout=5)
        await database_sync_to_async(write_step)()
        outcome["message"] = await member_socket.receive_json_from(timeout=3)
        await member_socket.disconnect()
        return outcome

    outcome = scenario()
    assert (outcome["anonymous"], outcome["outsider"], outcome["member"]) == (False, False, True)
    message = outcome["message"]
    assert message["type"] == "run.step" and message["step"] == 31 and message["points"] == {"reward/mean": 0.5}
