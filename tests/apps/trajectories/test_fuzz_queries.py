"""Property: the trajectory list answers below 500 for any query string: any of its parameters with any text,
integer or float, and any `after` cursor (arbitrary text, or base64 of arbitrary JSON, pairs of [value, id]
included). A bad value is the caller's mistake (400 naming it) or ignored, never a server error."""


from django.urls import reverse
from hypothesis import given
from hypothesis import strategies as st

from apps.trajectories.selectors import FILTERS, SORTS
from tests.support.fuzz import EDGE_NUMBERS, TIMES, b64_json, bounded, json_values

PARAMETERS = (*FILTERS, "sort", "after")
VALUES = st.text(max_size=30) | st.integers().map(str) | st.floats().map(str) | st.sampled_from([*SORTS, ""])
QUERIES = st.dictionaries(st.sampled_from(PARAMETERS), VALUES, max_size=5)
CURSOR_VALUES = json_values(EDGE_NUMBERS, TIMES)
CURSORS = (st.text(max_size=60) | CURSOR_VALUES.map(b64_json)
           | st.tuples(CURSOR_VALUES, CURSOR_VALUES | st.uuids().map(str)).map(lambda pair: b64_json(list(pair))))


@bounded(150)
@given(query=QUERIES, after=st.none() | CURSORS, sort=st.sampled_from(list(SORTS)))
def test_the_trajectory_list_answers_below_500_for_any_query(client, owner, project, studio_run, query, after, sort):
    client.force_login(owner)
    url = reverse("trajectories:trajectory_list", kwargs={"project": project.slug})
    query = {"sort": sort, **query}
    if after is not None:
        query["after"] = after
    response = client.get(url, query)
    assert response.status_code in (200, 400), (query, response.status_code)
    if response.status_code == 400:
        assert response.context["error"], query
