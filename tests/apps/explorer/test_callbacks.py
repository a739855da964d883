"""The Dash explorer's callbacks answer only requests that carry Django's CSRF token (who may open the explorer
at all is tests/apps/runs/test_access.py)."""

import json


def test_the_explorer_callback_needs_the_csrf_token(client, owner, project, studio_run):
    client = type(client)(enforce_csrf_checks=True)
    client.force_login(owner)
    page = client.get(f"/p/{project.slug}/explore/")
    assert page.status_code == 200 and b"_dash-config" in page.content
    token = client.cookies["csrftoken"].value
    body = {"output": "summary.children", "outputs": {"id": "summary", "property": "children"},
            "inputs": [{"id": i, "property": "value", "value": None}
                       for i in ("run", "domain", "template", "layer", "status", "policy-min", "policy-max")],
            "changedPropIds": ["run.value"]}
    body["output"] = ("..summary.children...reward-hist.figure...reward-by-version.figure...cost-hist.figure"
                      "...latency-hist.figure...idle-time.figure..")
    body["outputs"] = [{"id": i, "property": p} for i, p in (
        ("summary", "children"), ("reward-hist", "figure"), ("reward-by-version", "figure"), ("cost-hist", "figure"),
        ("latency-hist", "figure"), ("idle-time", "figure"))]
    url = f"/p/{project.slug}/explore/_dash-update-component"
    refused = client.post(url, json.dumps(body), content_type="application/json")
    assert refused.status_code == 403
    answer = client.post(url, json.dumps(body), content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert answer.status_code == 200, answer.content[:500]
    assert json.loads(answer.content)["response"]["summary"]["children"].startswith("90 trajectories")
