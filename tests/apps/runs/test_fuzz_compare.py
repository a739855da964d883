"""Property: the compare page answers 200 for any query string: run ids that are no run's (any text, integers,
floats, real ids among them) are left out, metric names that no run has are ignored."""

from django.urls import reverse
from hypothesis import given
from hypothesis import strategies as st

from tests.support.fuzz import bounded

VALUES = st.text(max_size=40) | st.integers().map(str) | st.floats().map(str) | st.uuids().map(str)
QUERIES = st.dictionaries(st.sampled_from(["run", "metric", "after", "sort"]), st.lists(VALUES, max_size=4),
                          max_size=3)


@bounded(60)
@given(query=QUERIES, real=st.booleans())
def test_the_compare_page_answers_200_for_any_query(client, owner, project, studio_run, query, real):
    run, _ = studio_run
    client.force_login(owner)
    if real:
        query = {**query, "run": [*query.get("run", []), str(run.pk)], "metric": [*query.get("metric", []),
                                                                               "reward/mean"]}
    response = client.get(reverse("runs:run_compare", kwargs={"project": project.slug}), query)
    assert response.status_code == 200, (query, response.status_code)
    shown = [str(r.pk) for r in response.context["runs"]]
    assert shown == ([str(run.pk)] if real or str(run.pk) in query.get("run", []) else [])
