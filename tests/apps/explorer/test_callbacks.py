"""The Dash explorer's callbacks answer only requests that carry Django's CSRF token (who may open the explorer
at all is tests/apps/runs/test_access.py); a callback or a file the page could not ask for is the caller's
mistake (a 200 whose summary says what was wrong, a 400 or a 404), never a 500."""

import json

import pytest


def test_the_explorer_callback_needs_the_csrf_token(client, owner, project, studio_run):
    client = type(client)(enforce_csrf_checks=True)
    client.force_login(owner)
    page = client.get(f"/p/{project.slug}/explore/")
    assert page.status_code == 200 and b"_dash-config" in page.content
    token = client.cookies["csrftoken"].value
    body = {"output": "summary.children", "outputs": {"id": "summary", "property": "children"},
            "inputs": [{"id": i, "property": "value", "value": None}
                       for i in ("run", "domain", "template", "layer", "status", "policy-min", "policy-max",
                                 "category")],
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


# --- callbacks and files the page could not ask for -----------------------------------------------------------

UPDATE_OUTPUT = ("..summary.children...reward-hist.figure...reward-by-version.figure...cost-hist.figure"
                 "...latency-hist.figure...idle-time.figure..")
FILTERS = ("run", "domain", "template", "layer", "status", "policy-min", "policy-max", "category")


def update_body(**values) -> dict:
    """The body the page sends when a filter changes: `values` by input id (policy-min as policy_min)."""
    return {"output": UPDATE_OUTPUT,
            "outputs": [{"id": i, "property": p} for i, p in (
                ("summary", "children"), ("reward-hist", "figure"), ("reward-by-version", "figure"),
                ("cost-hist", "figure"), ("latency-hist", "figure"), ("idle-time", "figure"))],
            "inputs": [{"id": i, "property": "value", "value": values.get(i.replace("-", "_"))} for i in FILTERS],
            "changedPropIds": ["run.value"]}


@pytest.fixture
def explorer(client, owner, project):
    client.force_login(owner)
    return client, f"/p/{project.slug}/explore/"


def update(explorer, body):
    client, base = explorer
    return client.post(base + "_dash-update-component", body if isinstance(body, str) else json.dumps(body),
                       content_type="application/json")


@pytest.mark.parametrize("values, summary", [
    ({"run": "not-a-uuid"}, "No trajectories: run 'not-a-uuid' is not a run's id."),
    ({"run": 5}, "No trajectories: run 5 is not a run's id."),
    ({"policy_min": "abc"}, "No trajectories: policy_version 'abc' is not a whole number."),
    ({"policy_max": 2.5}, "No trajectories: policy_version 2.5 is not a whole number."),
    ({"domain": [{"name": "arithmetic"}]}, "No trajectories: domain: expected a list of names, not "
                                           "[{'name': 'arithmetic'}]."),
    ({"status": "ok"}, "No trajectories: status: expected a list of names, not 'ok'."),
    ({"layer": [1, 2]}, "No trajectories: deciding_layer: expected a list of names, not [1, 2]."),
    ({"category": "algebra"}, "No trajectories: category: expected a list of names, not 'algebra'."),
])
def test_a_filter_value_the_page_cannot_send_is_named_in_the_summary(explorer, values, summary):
    answer = update(explorer, update_body(**values))
    assert answer.status_code == 200, answer.content[:500]
    response = json.loads(answer.content)["response"]
    assert response["summary"]["children"] == summary
    assert set(response) == {"summary", "reward-hist", "reward-by-version", "cost-hist", "latency-hist", "idle-time"}


@pytest.mark.parametrize("body, problem", [
    ({**update_body(), "output": "summary.children"}, "names no callback"),
    ({**update_body(), "output": "..nothing.children.."}, "names no callback"),
    ({k: v for k, v in update_body().items() if k != "output"}, "names no callback"),
    ([update_body()], "names no callback"),
    ({**update_body(), "inputs": {"run": None}}, "inputs are not a list"),
    ({**update_body(), "inputs": ["run"]}, "inputs are not a list"),
    ("{not json", "is not JSON"),
    ("[" * 100_000 + "]" * 100_000, "is not JSON"),
])
def test_a_callback_request_the_page_could_not_send_is_400(explorer, body, problem):
    answer = update(explorer, body)
    assert answer.status_code == 400, answer.content[:500]
    assert problem in json.loads(answer.content)["detail"]


@pytest.mark.parametrize("rest", [
    "_dash-component-suites/dash/../../../etc/passwd",
    "_dash-component-suites/dash/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "_dash-component-suites/dash/..%2f..%2f..%2fstudio/settings.py",
    "_dash-component-suites/dash/no-such-bundle.v1.js",
    "_dash-component-suites/no_such_package/bundle.js",
    "_dash-component-suites/dash/dcc/../../../../studio/settings.py",
])
def test_a_bundle_the_page_could_not_ask_for_is_404(explorer, rest):
    client, base = explorer
    answer = client.get(base + rest)
    assert answer.status_code == 404, answer.content[:300]
    assert b"root:" not in answer.content and b"SECRET_KEY" not in answer.content
