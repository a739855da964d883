"""The trajectory list with query parameters no page of ours makes: a filter that cannot name anything, a keyset
cursor whose value is not what its sort's column holds. Each answers 400 with the page saying what was wrong,
never a 500."""

import base64
import json

import pytest
from django.urls import reverse

from apps.trajectories.selectors import SORTS, cursor_encode

RUN_ID = "0b6f1c8e-4c43-4d0c-8f5a-0a3f7e9a5d21"  # a well-formed id (no row has it)
NUMERIC_SORTS = [name for name, (column, _, _) in SORTS.items() if column != "finished_at"]
TIME_SORTS = [name for name, (column, _, _) in SORTS.items() if column == "finished_at"]


def cursor(value, pk=RUN_ID) -> str:
    """A cursor as the pages make one (base64 of the JSON [value, id]), holding any value."""
    return cursor_encode(value, pk)


@pytest.fixture
def trajectories(client, owner, project):
    """trajectories(**query) -> the trajectory list page of `project` for that query, as the owner. The checks
    come before any row is read, so the tests need no rows."""
    client.force_login(owner)
    url = reverse("trajectories:trajectory_list", kwargs={"project": project.slug})
    return lambda **query: client.get(url, query)


def error_of(page, field="after") -> str:
    """The page's error, checked to be a 400 about `field` (a damaged page link is about `after`)."""
    assert page.status_code == 400, page.content[:500]
    assert f'data-field="{field}"'.encode() in page.content
    return page.context["error"]


@pytest.mark.parametrize("query, problem", [
    ({"run": "not-a-uuid"}, "run 'not-a-uuid' is not a run's id"),
    ({"policy_version": "abc"}, "policy_version 'abc' is not a whole number"),
    ({"policy_version": "1.5"}, "policy_version '1.5' is not a whole number"),
    ({"reward_min": "lots"}, "reward_min 'lots' is not a number"),
    ({"reward_max": "nan"}, "reward_max 'nan' is not a number"),
    ({"domain": "a\x00b"}, "domain 'a\\x00b' holds a NUL character, which no stored value has"),
])
def test_a_filter_that_cannot_name_anything_is_400_naming_it(trajectories, query, problem):
    page = trajectories(**query)
    assert error_of(page, field=next(iter(query))) == problem
    assert problem.replace("'", "&#x27;").encode() in page.content


@pytest.mark.parametrize("sort", list(SORTS))
@pytest.mark.parametrize("value", [[1, 2], {"x": 1}, {"t": ["2026-01-01"]}], ids=["list", "dict", "dict-of-list"])
def test_a_cursor_whose_value_is_of_the_wrong_type_is_400(trajectories, sort, value):
    assert "this page link is damaged" in error_of(trajectories(sort=sort, after=cursor(value)))


@pytest.mark.parametrize("sort", TIME_SORTS)
@pytest.mark.parametrize("value", [0.5, 1764763200], ids=["float", "int"])
def test_a_number_where_a_time_belongs_is_400(trajectories, sort, value):
    assert "this page link is damaged" in error_of(trajectories(sort=sort, after=cursor(value)))


@pytest.mark.parametrize("sort", NUMERIC_SORTS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), True], ids=["nan", "inf", "-inf", "true"])
def test_a_number_that_is_no_finite_number_is_400(trajectories, sort, value):
    assert "this page link is damaged" in error_of(trajectories(sort=sort, after=cursor(value)))


@pytest.mark.parametrize("sort", NUMERIC_SORTS)
def test_an_integer_past_a_floats_range_is_400(trajectories, sort):
    assert "this page link is damaged" in error_of(trajectories(sort=sort, after=cursor(10**400)))


@pytest.mark.parametrize("sort", TIME_SORTS)
@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:00:00-12:00"])
def test_a_time_out_of_range_in_utc_is_400(trajectories, sort, moment):
    assert "this page link is damaged" in error_of(trajectories(sort=sort, after=cursor({"t": moment})))


@pytest.mark.parametrize("sort", list(SORTS))
@pytest.mark.parametrize("pk", ["not-a-uuid", 5, None, [RUN_ID]], ids=["text", "int", "null", "list"])
def test_a_cursor_whose_id_is_not_an_id_is_400(trajectories, sort, pk):
    value = {"t": "2026-01-01T00:00:00+00:00"} if sort in TIME_SORTS else 0.5
    raw = base64.urlsafe_b64encode(json.dumps([value, pk]).encode()).decode()
    assert "this page link is damaged" in error_of(trajectories(sort=sort, after=raw))
