"""The studio's pages at 1,000 domains (issue 43), without a browser: the run page is the same size as at 10
domains and its live step messages too (the per-domain rewards come a page at a time from the domains endpoint,
which searches, filters by category, sorts and pages them); the compare page, the leaderboard, the paired
comparison, the trajectory browser, the explorer and the run form's weights list a bounded page of domains, never
all of them. The data (tests/support/domain_pages.py) is built once for the module, in bulk."""

import json
import re

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.urls import reverse

from apps.explorer.dash_app import MAX_GROUPS, explorer_figures
from apps.runs import live
from apps.runs.models import Run
from apps.runs.services import run_step_record
from apps.trajectories.selectors import trajectory_slice
from tests.support.domain_pages import CATEGORIES, domain_pages_for_module

DOMAINS = 1000
STEPS = 30


@pytest.fixture(scope="module")
def pages(django_db_setup, django_db_blocker):
    with domain_pages_for_module(django_db_blocker, count=DOMAINS, steps=STEPS) as built:
        yield built


@pytest.fixture
def client_as_owner(client, pages, db):
    client.force_login(pages.owner)
    return client


def _run_url(pages, run, name="runs:run_detail", **query) -> str:
    return reverse(name, kwargs={"project": pages.project.slug, "run_id": run.pk})


def _step_points(domains, value=0.5) -> dict:
    """A step's points as the trainer writes them: the overall ones and one per domain drawn."""
    points = {f"reward/{d}": value for d in domains}
    points.update({"reward/mean": value, "reward/slope_per_hour": 0.1, "throughput/trajectories_per_hour": 5000.0,
                   "idle/generation": 0.3, "policy/kl": 0.01})
    return points


def test_a_steps_live_message_is_no_larger_at_1000_domains_than_at_10(pages, db, django_capture_on_commit_callbacks):
    """What reaches an open run page through the channel layer after a step commits: the overall points and how
    many per-domain points the step wrote, never the per-domain points themselves."""
    layer = get_channel_layer()
    received = {}
    for run, bundle in ((pages.few_run, pages.few), (pages.wide_run, pages.wide)):
        channel = async_to_sync(layer.new_channel)()
        async_to_sync(layer.group_add)(live.group_name(run.pk), channel)
        with django_capture_on_commit_callbacks(execute=True):
            run_step_record(run_id=run.pk, attempt=run.attempt, step=STEPS + 1, wall_time=1.0, trajectories=[],
                            points=_step_points(bundle.domains))
        received[len(bundle.domains)] = async_to_sync(layer.receive)(channel)
        async_to_sync(layer.group_discard)(live.group_name(run.pk), channel)
    few, wide = received[10], received[DOMAINS]
    assert few["points"] == wide["points"] and "reward/mean" in wide["points"]
    assert not any(name.startswith("reward/") and name not in ("reward/mean", "reward/slope_per_hour")
                   for name in wide["points"])
    assert (few["domains"], wide["domains"]) == (10, DOMAINS)  # the page knows the domains moved
    size = {n: len(json.dumps({k: v for k, v in m.items() if k != "run"})) for n, m in received.items()}
    assert size[DOMAINS] <= size[10] + 2, size  # "domains": 1000 is two digits longer than 10


def test_the_run_page_does_not_grow_with_its_domains(pages, client_as_owner):
    client = client_as_owner
    html = {n: client.get(_run_url(pages, run)).content.decode()
            for n, run in ((10, pages.few_run), (DOMAINS, pages.wide_run))}
    # The same panels (no chart per domain), and the category filter's options: 10 categories against 12.
    for page in html.values():
        panels = json.loads(re.search(r'<script id="run-panels" type="application/json">(.*?)</script>', page,
                                      re.S).group(1))
        assert [p["key"] for p in panels] == ["reward", "throughput", "cost", "idle", "policy", "ns-trainer"]
        reward = json.loads(panels[0]["figure"])
        assert [t["meta"] for t in reward["data"]] == ["reward/mean"]
        assert 'id="run-domains"' in page and "data-domain-heatmap" in page
    assert len(html[DOMAINS]) - len(html[10]) < 600, (len(html[10]), len(html[DOMAINS]))
    assert "dom-0500" not in html[DOMAINS] and html[DOMAINS].count("<option") < 30
    # The history the page loads leaves the per-domain series out: the same series at 1,000 domains as at 10.
    history = {n: json.loads(client.get(_run_url(pages, run, "runs:run_history") + "?per_domain=0").content)
               for n, run in ((10, pages.few_run), (DOMAINS, pages.wide_run))}
    assert sorted(history[10]["series"]) == sorted(history[DOMAINS]["series"])
    assert "reward/dom-0001" in json.loads(client.get(_run_url(pages, pages.wide_run, "runs:run_history"),
                                                      {"name": "reward/dom-0001"}).content)["series"]


def test_the_domains_endpoint_pages_searches_filters_and_sorts_a_thousand_domains(pages, client_as_owner):
    url = _run_url(pages, pages.wide_run, "runs:run_domains")

    def get(**query):
        response = client_as_owner.get(url, query)
        assert response.status_code == 200
        return json.loads(response.content)

    first = get()
    assert (first["domains"], first["total"], first["pages"], len(first["rows"])) == (DOMAINS, DOMAINS, 40, 25)
    assert [r["domain"] for r in first["rows"]][:3] == ["dom-0000", "dom-0001", "dom-0002"]
    assert len(first["steps"]) <= 48 and first["steps"][-1] == STEPS and first["bucket"] == 1
    assert all(len(r["cells"]) == len(first["steps"]) for r in first["rows"])
    assert [name for name, _ in first["categories"]] == list(CATEGORIES)
    assert sum(g["domains"] for g in first["groups"]) == DOMAINS and len(first["groups"]) == len(CATEGORIES)
    assert all(r["trajectories"] == 1 for r in first["rows"])
    assert len(json.dumps(first)) < 20_000

    # Sorted by reward, the best first, across every page: page 2 starts below page 1's end.
    best = get(sort="reward", order="desc", per_page=50)
    second = get(sort="reward", order="desc", per_page=50, page=2)
    rewards = [r["reward"] for r in best["rows"] + second["rows"]]
    assert rewards == sorted(rewards, reverse=True) and rewards[0] > rewards[-1]
    everything = [r["reward"] for page in range(1, 11) for r in get(sort="domain", per_page=100, page=page)["rows"]]
    assert rewards[0] == max(everything) and len(everything) == DOMAINS
    assert get(sort="change", order="desc")["rows"][0]["change"] >= get(sort="change")["rows"][0]["change"]

    # A search, a category, both; a page past the end is the last one.
    assert [r["domain"] for r in get(q="0042")["rows"]] == ["dom-0042"]
    arc = get(category="arc", per_page=100)
    assert arc["total"] == len(pages.wide.in_category("arc")) == 84
    assert {r["category"] for r in arc["rows"]} == {"arc"} and [g["category"] for g in arc["groups"]] == ["arc"]
    both = get(category="arc", q="00")
    assert both["total"] == len([d for d in pages.wide.in_category("arc") if "00" in d]) and both["total"] > 0
    assert get(page=999)["page"] == 40
    assert get(q="no-such-domain")["rows"] == []


def test_the_compare_page_lists_a_page_of_domains_and_charts_none_of_them_unasked(pages, client_as_owner):
    url = reverse("runs:run_compare", kwargs={"project": pages.project.slug})
    runs = [str(pages.wide_run.pk), str(pages.few_run.pk)]
    page = client_as_owner.get(url, {"run": runs})
    assert page.status_code == 200
    assert [f["name"] for f in page.context["figures"]] == ["reward/mean"]
    assert not any(n.startswith("reward/dom-") for n in page.context["metric_names"])  # no option per domain
    content = page.content.decode()
    assert content.count('<tr data-domain="') == 25 and content.count('<tr data-category="') == len(CATEGORIES)
    assert len(content) < 60_000
    # Sorted by the difference (few-run has none of wide-run's domains: no difference), filtered, a domain charted.
    arc = client_as_owner.get(url, {"run": runs, "dcategory": "arc", "dq": "01", "dsort": "reward",
                                    "dorder": "desc"})
    shown = re.findall(r'<tr data-domain="([^"]+)">', arc.content.decode())
    assert shown and all(pages.wide.categories[d] == "arc" and "01" in d for d in shown)
    charted = client_as_owner.get(url, {"run": runs, "metric": ["reward/mean", "reward/dom-0007"]})
    assert [f["name"] for f in charted.context["figures"]] == ["reward/mean", "reward/dom-0007"]
    # The bundles' diff: a thousand domains differ, forty are listed.
    assert charted.content.decode().count('<li class="removed">') <= 40


def test_the_leaderboard_breaks_a_thousand_domains_down_a_page_at_a_time(pages, client_as_owner):
    suite = pages.suite.bundle
    url = reverse("evals:suite", kwargs={"project": pages.project.slug, "slug": suite.definition.slug,
                                         "number": suite.number})
    page = client_as_owner.get(url)
    assert page.status_code == 200
    content = page.content.decode()
    assert re.findall(r'<tr data-row="([^"]+)">', content) == ["model/strong@1", "model/middle@1", "model/weak@1"]
    assert content.count("<tr data-domain-row=") == 25
    assert content.count('<tr data-category="') == len(CATEGORIES)
    assert len(content) < 80_000 and "ev-0500" not in content
    assert "3000 versions" not in content and "1000 versions (1000 domains)" in content  # pinned: counted
    strong = pages.evaluations[0].pk
    ordered = client_as_owner.get(url, {"dsort": f"e{strong}", "dorder": "desc", "dcategory": "logic",
                                        "dper_page": 50}).content.decode()
    rows = re.findall(r'<tr data-domain-row="([^"]+)">(.*?)</tr>', ordered, re.S)
    assert len(rows) == 50 and {pages.suite.categories[d] for d, _ in rows} == {"logic"}
    firsts = [float(re.search(r'data-value="([^"]+)"', cells).group(1)) for _, cells in rows]
    assert firsts == sorted(firsts, reverse=True)
    found = client_as_owner.get(url, {"dq": "ev-0999"}).content.decode()
    assert re.findall(r'<tr data-domain-row="([^"]+)">', found) == ["ev-0999"]


def test_the_paired_comparison_pages_its_domains_and_keeps_the_overall_row(pages, client_as_owner):
    strong, weak = pages.evaluations[0], pages.evaluations[2]
    url = reverse("evals:compare", kwargs={"project": pages.project.slug, "a": weak.pk, "b": strong.pk})
    content = client_as_owner.get(url).content.decode()
    domains = re.findall(r'<tr data-domain="([^"]+)">', content)
    assert domains[0] == "all" and len(domains) == 26
    assert content.count("<tr data-task=") <= 100  # fifty regressions and fifty improvements at most
    assert len(content) < 120_000
    only_arc = client_as_owner.get(url, {"dcategory": "arc", "dsort": "difference", "dorder": "desc"})
    arc = re.findall(r'<tr data-domain="([^"]+)">', only_arc.content.decode())[1:]
    assert arc and {pages.suite.categories[d] for d in arc} == {"arc"}
    changed = re.findall(r'<tr data-task="[^"]+"><td class="code">[^<]*</td><td>([^<]+)</td>',
                         only_arc.content.decode())
    assert changed and {pages.suite.categories[d] for d in changed} == {"arc"}  # the task lists follow


def test_the_trajectory_browser_and_the_explorer_filter_and_group_by_category(pages, client_as_owner):
    url = reverse("trajectories:trajectory_list", kwargs={"project": pages.project.slug})
    page = client_as_owner.get(url, {"run": str(pages.wide_run.pk), "category": "games"})
    assert page.status_code == 200 and page.context["page"].rows
    assert {pages.wide.categories[t.domain] for t in page.context["page"].rows} == {"games"}
    assert page.content.decode().count("<option") < 150  # runs, statuses, verdicts, sorts, twelve categories
    rows = trajectory_slice(project=pages.project, run=str(pages.wide_run.pk), categories=["games", "logic"])
    assert len(rows) == 2 * 83 and {pages.wide.categories[r["domain"]] for r in rows} == {"games", "logic"}
    every = trajectory_slice(project=pages.project, run=str(pages.wide_run.pk))
    reward = explorer_figures(project=pages.project, rows=every, run_id=str(pages.wide_run.pk))[0]
    assert len(reward.data) <= MAX_GROUPS + 1 and "by category (1000 domains)" in reward.layout.title.text


def test_the_run_forms_editor_lists_a_page_of_domains_and_a_category_weight_reaches_the_run(pages,
                                                                                            client_as_owner):
    client = client_as_owner
    url = reverse("runs:run_new_domains", kwargs={"project": pages.project.slug})
    body = json.loads(client.get(url, {"bundle": pages.wide.bundle.pk}).content)
    assert [name for name, _ in body["categories"]] == list(CATEGORIES)
    assert (body["domains_total"], body["total"], len(body["domains"])) == (DOMAINS, DOMAINS, 25)
    category = pages.wide.categories["dom-0500"]
    found = json.loads(client.get(url, {"bundle": pages.wide.bundle.pk, "q": "0500", "category": category}).content)
    assert found["domains"] == [{"domain": "dom-0500", "category": category, "weight": 1.0}]
    other = next(c for c in CATEGORIES if c != category)
    assert json.loads(client.get(url, {"bundle": pages.wide.bundle.pk, "q": "0500", "category": other}).content)[
        "domains"] == []
    assert json.loads(client.get(url, {"bundle": "0"}).content)["domains"] == []  # no such bundle: nothing

    new = reverse("runs:run_new", kwargs={"project": pages.project.slug})
    form = client.get(new).context["form"]
    values = {name: form.initial.get(name, field.initial) for name, field in form.fields.items() if not field.disabled}
    data = {name: form.fields[name].prepare_value(value) for name, value in values.items()
            if value is not None and value is not False}
    data.update(bundle=pages.wide.bundle.pk, steps=5, name="weighted", category_weights='{"algebra": 2}',
                category_quotas='{"arc": 0.25}', domain_weights='{"dom-0042": 3}')
    review = client.post(new, {**data, "action": "review"})
    assert review.status_code == 200, review.content[:500]
    client.post(new, {**data, "reviewed": review.context["config_hash"], "action": "queue"})
    run = Run.objects.get(name="weighted")
    assert (run.config["category_weights"], run.config["category_quotas"], run.config["domain_weights"]) == (
        {"algebra": 2}, {"arc": 0.25}, {"dom-0042": 3})
