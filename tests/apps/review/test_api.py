"""The review API (apps/review/api.py) with its roles: an editor draws a queue, the queue's reviewers take items
and label them with review-scoped tokens, a blind queue hides others' labels until one's own is in, agreement
is read by any member, an owner adjudicates; bad input gets a 4xx that names it and writes nothing."""

import pytest

from apps.accounts.models import AuditEvent
from apps.review.models import Adjudication, Label

QUEUES = "/projects/acme-rl/review/queues"


@pytest.fixture
def people(member):
    return {"editor": member("editor"), "ann": member("reviewer"), "viewer": member("viewer")}


@pytest.fixture
def apis(api_as, project, people, owner):
    return {"editor": api_as(people["editor"], project=project, scope="write"),
            "ann": api_as(people["ann"], project=project, scope="review"),
            "bob": api_as(people["editor"], project=project, scope="review"),
            "viewer": api_as(people["viewer"], project=project, scope="read"),
            "owner": api_as(owner, project=project, scope="admin")}


def make_queue(apis, **body):
    return apis["editor"].post(QUEUES, {"slug": "check", "rubric": "correctness", "overlap": 2,
                                        "reviewers": ["reviewer-user", "editor-user"],
                                        "sampling": {"rule": "random", "n": 4}, **body})


def test_reviewers_label_blind_and_agreement_and_adjudication_follow(archive, rubric, apis):
    created = make_queue(apis)
    assert created.status_code == 201, created.json()
    assert created.json()["rubric"] == "rubric/correctness@1" and created.json()["blind"] is True
    assert apis["viewer"].post(f"{QUEUES}/check/next", {}).status_code == 403  # viewers read, never label

    ann_item = apis["ann"].post(f"{QUEUES}/check/next", {}).json()
    bob_item = apis["bob"].post(f"{QUEUES}/check/next", {}).json()
    assert ann_item["id"] == bob_item["id"] and ann_item["labels"] == []
    item = ann_item["id"]
    wrong = apis["ann"].post(f"{QUEUES}/check/items/{item}/labels", {"answers": {"verdict": 3}})
    assert wrong.status_code == 400 and wrong.json()["errors"][0]["field"] == "answers.verdict"
    assert not Label.objects.exists()
    assert apis["ann"].post(f"{QUEUES}/check/items/{item}/labels",
                            {"answers": {"verdict": "correct"}}).status_code == 201
    # Blind: Bob, who has not labelled, does not see Ann's label when he takes the item again.
    assert apis["bob"].post(f"{QUEUES}/check/next", {}).json()["labels"] == []
    assert apis["bob"].post(f"{QUEUES}/check/items/{item}/labels",
                            {"answers": {"step_ok": False}, "step": 1}).status_code == 201  # a step label
    bob_whole = apis["bob"].post(f"{QUEUES}/check/items/{item}/labels", {"answers": {"verdict": "reward-hack"}})
    assert bob_whole.status_code == 201 and bob_whole.json()["reviewer"] == "editor-user"
    again = apis["bob"].post(f"{QUEUES}/check/items/{item}/labels", {"answers": {"verdict": "wrong"}})
    assert again.status_code == 409

    for verdicts in (("correct", "correct"), ("wrong", "wrong"), ("correct", "correct")):
        taken = apis["ann"].post(f"{QUEUES}/check/next", {}).json()["id"]
        assert apis["bob"].post(f"{QUEUES}/check/next", {}).json()["id"] == taken
        for who, verdict in zip(("ann", "bob"), verdicts, strict=True):
            assert apis[who].post(f"{QUEUES}/check/items/{taken}/labels",
                                  {"answers": {"verdict": verdict}}).status_code == 201
    assert apis["ann"].post(f"{QUEUES}/check/next", {}).status_code == 204  # all four items have two labels

    [verdict, _quality] = apis["viewer"].get(f"{QUEUES}/check/agreement").json()
    assert verdict["question"] == "verdict" and verdict["items"] == 4 and verdict["disagreements"] == [item]
    assert verdict["low"] <= verdict["alpha"] <= verdict["high"]
    assert apis["ann"].post(f"{QUEUES}/check/items/{item}/adjudication",
                            {"question": "verdict", "answer": "wrong"}).status_code == 403
    decided = apis["owner"].post(f"{QUEUES}/check/items/{item}/adjudication",
                                 {"question": "verdict", "answer": "reward-hack"})
    assert decided.status_code == 201 and Adjudication.objects.get().answer == "reward-hack"
    assert AuditEvent.objects.filter(action="review.label", via="api").count() == 9


def test_bad_queues_and_labels_are_refused_with_their_field(archive, rubric, apis):
    unknown = make_queue(apis, rubric="nope")
    assert unknown.status_code == 404 and unknown.json()["errors"][0]["field"] == "rubric"
    assert make_queue(apis, reviewers=["stranger"]).status_code == 404
    rule = make_queue(apis, sampling={"rule": "vibes"})
    assert rule.status_code == 400 and rule.json()["errors"][0]["field"] == "sampling.rule"
    run = make_queue(apis, filters={"run": "not-a-uuid"})  # a trajectory filter, named inside the queue's filters
    assert run.status_code == 400 and run.json()["errors"] == [
        {"field": "filters.run", "problem": "run 'not-a-uuid' is not a run's id"}]
    assert apis["ann"].post(QUEUES, {"slug": "x", "rubric": "correctness"}).status_code == 403  # editors create
    assert make_queue(apis).status_code == 201
    assert make_queue(apis).status_code == 409  # the slug is taken
    outside = apis["ann"].post(f"{QUEUES}/check/items/999999/labels", {"answers": {"verdict": "correct"}})
    assert outside.status_code == 404
    assert apis["ann"].get(f"{QUEUES}/nope").status_code == 404


def test_a_reviewer_amends_their_label_through_the_api_as_a_new_revision(archive, rubric, apis):
    assert make_queue(apis, overlap=1).status_code == 201
    item = apis["ann"].post(f"{QUEUES}/check/next", {}).json()["id"]
    labels = f"{QUEUES}/check/items/{item}/labels"
    first = apis["ann"].post(labels, {"answers": {"verdict": "correct"}}).json()
    assert (first["revision"], first["supersedes"]) == (1, None)

    amended = apis["ann"].post(f"{labels}/{first['id']}/revisions",
                               {"answers": {"verdict": "wrong"}, "comment": "misread the sum"})
    assert amended.status_code == 201, amended.json()
    body = amended.json()
    assert (body["revision"], body["supersedes"], body["answers"], body["comment"]) == (
        2, first["id"], {"verdict": "wrong"}, "misread the sum")
    assert Label.objects.get(pk=first["id"]).answers == {"verdict": "correct"}  # the first answer is kept
    stale = apis["ann"].post(f"{labels}/{first['id']}/revisions", {"answers": {"verdict": "format"}})
    assert stale.status_code == 409 and f"label {body['id']}" in stale.json()["detail"]
    bad = apis["ann"].post(f"{labels}/{body['id']}/revisions", {"answers": {"verdict": "maybe"}})
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "answers.verdict"
    assert apis["bob"].post(f"{labels}/{body['id']}/revisions",
                            {"answers": {"verdict": "format"}}).status_code == 404  # only one's own label
    assert apis["viewer"].post(f"{labels}/{body['id']}/revisions",
                               {"answers": {"verdict": "format"}}).status_code == 403
    assert apis["ann"].post(f"{QUEUES}/check/items/{item + 10**6}/labels/{body['id']}/revisions",
                            {"answers": {"verdict": "format"}}).status_code == 404  # the label is not that item's
    # An amended item is not offered again.
    taken = apis["ann"].post(f"{QUEUES}/check/next", {}).json()
    assert taken["id"] != item
    assert AuditEvent.objects.filter(action="review.label.amend", via="api").count() == 1
