"""The registry at many domains (issue 43): publishing, pinning, exporting and importing a bundle of them costs a
bounded number of queries, whatever the number of domains, and gives what it gave one domain at a time."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.accounts.services import project_create
from apps.registry.files import export_project, import_directory
from apps.registry.models import Version
from apps.registry.pins import PinnedBundleError, bundle_tasks
from apps.registry.services import version_publish
from tests.support.many_domains import CATEGORIES, many_domains_for_module
from workers.rl.config import GRPOConfig

DOMAINS = 48  # four per category


@pytest.fixture(scope="module")
def many(django_db_setup, django_db_blocker):
    with many_domains_for_module(django_db_blocker, count=DOMAINS, instances=3) as published:
        yield published


def _queries(work):
    with CaptureQueriesContext(connection) as queries:
        value = work()
    return value, len(queries.captured_queries)


def test_a_bundle_of_many_domains_pins_its_closure_in_a_few_queries(many, db):
    lock = many.bundle.lock
    assert len(lock.of_kind("domain")) == len(lock.of_kind("task_template")) == DOMAINS
    assert {p.name for p in lock.of_kind("sandbox_image", "verifier")} == {"sandbox_image/py-basic",
                                                                          "verifier/numeric"}
    republished, queries = _queries(lambda: version_publish(
        project=many.project, kind="bundle", slug="many-again", author=many.owner,
        spec={"members": [f"domain/{slug}@latest" for slug in many.domains]}).version)
    assert republished.spec["resolved"] == many.bundle.spec["resolved"]
    assert queries <= 25, queries  # one domain at a time it took about ten per domain


def test_pinning_reads_every_templates_tasks_at_once_with_categories_and_their_weights(many, db):
    config = GRPOConfig(category_weights={"algebra": 2.0}, category_quotas={"games": 0.1})
    tasks, queries = _queries(lambda: bundle_tasks(bundle=Version.objects.get(pk=many.bundle.pk), config=config))
    assert queries <= 6, queries  # the bundle, its project, its versions, their instances
    assert [d.name for d in tasks.domains] == list(many.domains)
    assert {d.category for d in tasks.domains} == set(CATEGORIES)
    by_name = {d.name: d for d in tasks.domains}
    assert all(by_name[slug].weight == (2.0 if many.categories[slug] == "algebra" else 1.0) for slug in many.domains)
    first = many.domains[5]
    template = f"task_template/{first}-t@1"
    assert [t.key for t in by_name[first].templates] == [template]
    assert list(tasks.items[template]) == ["t000", "t001", "t002"]
    assert tasks.items[template]["t002"].inputs == {"a": 5, "b": 2} and tasks.items[template]["t002"].hidden == {
        "answer": 7}
    with pytest.raises(PinnedBundleError, match="categories no domain of the bundle has: astrology"):
        bundle_tasks(bundle=many.bundle, config=GRPOConfig(category_quotas={"astrology": 0.5}))
    listed = r"does not have: nowhere \(it has syn-0000, .*, syn-0019 and 28 more\)$"  # not a thousand names
    with pytest.raises(PinnedBundleError, match=listed):
        bundle_tasks(bundle=many.bundle, config=GRPOConfig(domain_weights={"nowhere": 2.0}))


def test_an_export_of_many_domains_imports_as_the_same_bundle(many, db, tmp_path):
    _, queries = _queries(lambda: export_project(project=many.project, directory=tmp_path))
    assert queries <= 8, queries
    report = import_directory(directory=tmp_path, project_slug="many-copy", actor=many.owner)
    assert len(report.published) == 2 * DOMAINS + 3 and not report.unchanged  # each file's newest version once
    copy = Version.objects.get(definition__project__slug="many-copy", definition__kind="bundle",
                               definition__slug="many")
    assert copy.spec["resolved"] == many.bundle.spec["resolved"]
    original, imported = bundle_tasks(bundle=many.bundle), bundle_tasks(bundle=copy)
    assert imported.domains == original.domains and imported.item_hashes == original.item_hashes
    again = import_directory(directory=tmp_path, project_slug="many-copy", actor=many.owner)
    assert not again.published and len(again.unchanged) == 2 * DOMAINS + 3


def test_the_module_fixture_keeps_its_domains_and_not_a_tests_writes(many, db):
    project_create(team_slug="scratch", slug="scratch", name="Scratch", owner=many.owner)
    assert Version.objects.filter(definition__project=many.project, definition__kind="domain").count() == DOMAINS
