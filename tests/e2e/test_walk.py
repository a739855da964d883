"""A newcomer's walk through a seeded demo in Chromium: log in, then follow every link of the navigation and of
each page it leads to, one page of each kind (a definition and a version of each kind, a training run and an
evaluation's run, a trajectory, a review queue and one of its items, the leaderboard and the comparison, the
playgrounds, the upload page, the audit log, the API tokens, the explorer). The walk fails on any response of 400
or more from the studio, any console error and any uncaught page error, and lists every one with its page.

The demo is the one `make demo` seeds (apps/demo/seed.py), with what its first minutes add written the quick way:
runs of synthetic steps (apps/operations/synthetic.py) instead of training, a review queue as `make demo` draws it, and
two evaluations of the demo model on the demo suite whose answers are synthetic too.
"""

from collections import deque
from io import StringIO
from urllib.parse import urldefrag, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.urls import Resolver404, resolve

from apps.demo.seed import PASSWORD, USERNAME, seed
from apps.evals.services import evaluation_launch
from apps.operations.synthetic import run_synthetic_create, run_synthetic_steps
from apps.registry.refs import Ref
from apps.registry.selectors import version_resolve
from apps.runs.models import Run
from tests.e2e.conftest import ARTIFACTS

pytestmark = pytest.mark.browser

# What a walk must reach by following links alone, by view name (and, for a run, what it is).
REQUIRED = {
    ("runs:home", None), ("registry:definition_list", None), ("registry:definition_detail", "task_template"),
    ("registry:version_detail", "task_template"), ("task_import:task_upload", "task_template"),
    ("runs:run_list", None), ("runs:run_detail", "training"), ("runs:run_detail", "evaluation"),
    ("trajectories:trajectory_list", None), ("trajectories:trajectory_detail", None),
    ("review:queue_list", None), ("review:queue", None), ("review:item", None),
    ("evals:list", None), ("evals:suite", None), ("evals:compare", None),
    ("authoring:verifier_playground", None), ("authoring:template_playground", None),
    ("audit_log", None), ("api_tokens", None), ("explorer:index", None),
}
# Answers that are files, not pages (a dataset's rows, an evaluation's results, an artifact): fetched and checked,
# not opened.
FILES = {"trajectories:artifact", "evals:results_jsonl", "evals:results_lm_eval", "datasets:download"}
MOST_PAGES = 200  # a guard against a walk that never ends (links that make new links)


def demo_content():
    """The seeded demo, and what its first minutes add: a finished run, a running one, a review queue on their
    trajectories, and two evaluations of the base model on the demo suite."""
    project = seed().project
    owner = get_user_model().objects.get(username=USERNAME)
    bundle = version_resolve(project=project, ref=Ref("bundle", "demo"))
    finished = run_synthetic_create(project=project, bundle=bundle, steps=4, name="demo-finished", actor=owner)
    run_synthetic_steps(run=finished, steps=4)
    running = run_synthetic_create(project=project, bundle=bundle, steps=100, name="demo-live", actor=owner)
    run_synthetic_steps(run=running, steps=3, finish=False, seed=1)
    call_command("review_queue", "demo-check", "--rubric", "trajectory-review", "--sample", "stratified:6",
                 "--overlap", "2", "--reviewers", "demo,reviewer", "--adjudicators", "demo", "--project", "demo",
                 stdout=StringIO())
    suite = version_resolve(project=project, ref=Ref("bundle", "demo-suite"))
    model = version_resolve(project=project, ref=Ref("model", "demo-tiny"))
    for answers in (2, 3):
        evaluation = evaluation_launch(project=project, suite=suite, actor=owner, model=model, via="cli")
        run_synthetic_steps(run=evaluation.run, steps=evaluation.run.steps_total, seed=answers)
    return project


def page_kind(path: str):
    """(view name, what kind of page of that view) for a path of the studio, or None if no view answers it."""
    try:
        match = resolve(path)
    except Resolver404:
        return None
    if match.view_name == "runs:run_detail":
        run = Run.objects.filter(pk=match.kwargs["run_id"]).first()
        return match.view_name, "evaluation" if run and (run.config or {}).get("evaluation") else "training"
    return match.view_name, match.kwargs.get("kind")


def test_every_page_of_the_demo_opens_without_an_error(live_url, context):
    demo_content()
    origin = urlsplit(live_url).netloc
    failures: list[str] = []
    where = {"page": "the login page"}

    def ours(url: str) -> bool:
        return urlsplit(url).netloc == origin

    page = context.new_page()
    page.set_default_timeout(60_000)  # the first visit to each kind of page imports and renders cold
    page.on("console", lambda message: message.type == "error" and failures.append(
        f"{where['page']}: console error: {message.text} ({message.location.get('url') or 'the page'})"))
    page.on("pageerror", lambda error: failures.append(f"{where['page']}: uncaught error: {error}"))
    page.on("response", lambda response: response.status >= 400 and ours(response.url) and failures.append(
        f"{where['page']}: {response.status} for {response.request.method} {response.url}"))

    page.goto(f"{live_url}/accounts/login/")
    page.fill("input[name=username]", USERNAME)
    page.fill("input[name=password]", PASSWORD)
    page.click("form button[type=submit], form input[type=submit]")
    page.wait_for_load_state()
    if page.locator("[data-running-run]").all_inner_texts() != ["demo-live"]:
        failures.append(f"logging in lands on {page.url}, which does not point to the running run demo-live")

    visited: dict[tuple, str] = {}
    queue = deque([page.url])
    queued_kinds = {page_kind(urlsplit(page.url).path)}

    def settle():
        try:
            page.wait_for_load_state("networkidle", timeout=15_000)
        except Exception:  # a page that keeps polling is still a page: its errors are caught as they come
            pass

    def collect_links():
        for href in page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)"):
            url = urldefrag(href).url
            if not ours(url) or urlsplit(url).path.startswith(("/admin/", "/accounts/logout/")):
                continue
            path = urlsplit(url).path
            kind = page_kind(path)
            if kind is None:
                failures.append(f"{where['page']}: links to {url}, which no page answers")
            elif kind not in queued_kinds:
                queued_kinds.add(kind)
                queue.append(url)

    while queue and len(visited) < MOST_PAGES:
        url = queue.popleft()
        kind = page_kind(urlsplit(url).path)
        where["page"] = url
        if kind[0] in FILES or urlsplit(url).path.startswith("/api/"):
            answer = context.request.get(url)
            if answer.status >= 400:
                failures.append(f"{url}: {answer.status} for the file")
            visited[kind] = url
            continue
        try:
            page.goto(url)
        except Exception as exc:
            failures.append(f"{url}: could not be opened: {exc}")
            continue
        settle()
        visited[kind] = url
        collect_links()
        if kind == ("review:queue", None) and ("review:item", None) not in queued_kinds:
            # An item is reached through the queue's button (a form), as a reviewer starts.
            page.click("[data-start]")
            page.wait_for_load_state()
            settle()
            item = page_kind(urlsplit(page.url).path)
            visited[item] = page.url
            queued_kinds.add(item)
            where["page"] = page.url
            collect_links()

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "walk.txt").write_text("".join(f"{url}\n" for url in visited.values()), encoding="utf-8")
    missing = sorted(str(kind) for kind in REQUIRED - set(visited))
    report = "\n".join([*failures, *(f"not reached from the navigation: {kind}" for kind in missing)])
    assert not report, f"{len(failures)} errors in a walk of {len(visited)} pages:\n{report}"
