"""Versioning invariants of publish_version, aliases and bundles, on the real database."""

import threading

import pytest
from django.db import IntegrityError, InternalError, close_old_connections, connection, transaction

from apps.accounts.models import AuditEvent
from apps.registry.errors import PublishConflict, SpecError, VersionNotFound
from apps.registry.models import Alias, ImmutableVersionError, InstanceSet, TaskInstance, Version
from apps.registry.refs import Ref
from apps.registry.selectors import instance_page, version_resolve
from apps.registry.services import alias_move, version_publish
from tests.support.specimens import IMAGE_SPEC, TEMPLATE_SPEC, VERIFIER_SPEC, addition_instances
from workers.definitions.canonical import layer_chain_hashes


def publish(project, owner, kind, slug, spec, **extra):
    return version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner, **extra)


def test_first_publish_creates_version_one_with_audit_rows(project, owner):
    published = publish(project, owner, "sandbox_image", "py", IMAGE_SPEC, message="first")
    version = published.version
    assert published.created and version.number == 1 and version.parent is None
    assert version.message == "first" and version.author == owner and len(version.content_hash) == 64
    actions = list(AuditEvent.objects.filter(project=project).values_list("action", "target"))
    assert ("definition.create", "sandbox_image/py") in actions and ("version.publish", "sandbox_image/py@1") in actions


def test_identical_spec_returns_the_existing_version_and_writes_nothing(project, owner):
    first = publish(project, owner, "sandbox_image", "py", IMAGE_SPEC).version
    audits = AuditEvent.objects.count()
    # Spelling out a default is the same spec: the content hash is over the normalised spec.
    spelt_out = {**IMAGE_SPEC, "limits": {"memory_mb": 256, "network": False}}
    again = publish(project, owner, "sandbox_image", "py", spelt_out)
    assert not again.created and again.version.pk == first.pk
    assert Version.objects.count() == 1 and AuditEvent.objects.count() == audits


def test_a_change_creates_the_next_version_whose_parent_is_the_previous(project, owner):
    publish(project, owner, "sandbox_image", "py", IMAGE_SPEC)
    second = publish(project, owner, "sandbox_image", "py", {**IMAGE_SPEC, "warm_pool_size": 8}, message="more").version
    assert second.number == 2 and second.parent.number == 1 and second.spec["warm_pool_size"] == 8


def test_a_stale_edit_is_refused_and_writes_nothing(project, owner):
    publish(project, owner, "sandbox_image", "py", IMAGE_SPEC)
    publish(project, owner, "sandbox_image", "py", {**IMAGE_SPEC, "warm_pool_size": 8})
    with pytest.raises(PublishConflict, match="is at @2 now, but your edit started from @1"):
        publish(project, owner, "sandbox_image", "py", {**IMAGE_SPEC, "warm_pool_size": 9}, expected_head=1)
    assert Version.objects.count() == 2


def test_versions_cannot_be_changed_by_code(registry):
    version = registry["verifier"]
    version.message = "rewritten"
    with pytest.raises(ImmutableVersionError):
        version.save()
    with pytest.raises(ImmutableVersionError):
        Version.objects.filter(pk=version.pk).update(message="rewritten")
    with pytest.raises(ImmutableVersionError):
        version.delete()
    with pytest.raises(ImmutableVersionError):
        Version.objects.all().delete()


def test_the_database_refuses_to_update_a_version_row(registry):
    """Even raw SQL that bypasses the ORM: the trigger from migration 0002."""
    with pytest.raises((IntegrityError, InternalError), match="immutable"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("UPDATE registry_version SET message = 'rewritten'")
    assert not Version.objects.filter(message="rewritten").exists()


def test_bad_spec_names_every_field_and_writes_nothing(project, owner):
    bad = {"layers": [{"type": "python_packages", "packages": ["numpy"]}],
           "limits": {"memory_mb": "lots", "swap": 1}, "warm_pool_size": -1}
    with pytest.raises(SpecError) as caught:
        publish(project, owner, "sandbox_image", "py", bad)
    problems = {e.field: e.problem for e in caught.value.errors}
    assert problems["layers"] == "the first layer must be the base layer (type: base)"
    assert problems["limits.memory_mb"].startswith("Input should be a valid integer")
    assert problems["limits.swap"] == ("unknown field; the fields here are cpus, cpu_seconds, memory_mb, wall_seconds, "
                                       "max_processes, disk_mb, network")
    assert problems["warm_pool_size"] == "Input should be greater than or equal to 0"
    assert Version.objects.count() == 0 and AuditEvent.objects.filter(action__startswith="definition").count() == 0


@pytest.mark.parametrize("slug", ["../etc", "a/b", "with space", "UPPER", "", "x" * 64, "dot.ted"])
def test_slugs_with_path_characters_are_refused(project, owner, slug):
    with pytest.raises(SpecError, match="slug"):
        publish(project, owner, "sandbox_image", slug, IMAGE_SPEC)
    assert Version.objects.count() == 0


def test_references_must_name_existing_definitions(project, owner):
    with pytest.raises(SpecError) as caught:
        publish(project, owner, "task_template", "t", TEMPLATE_SPEC)
    fields = {e.field for e in caught.value.errors}
    assert fields == {"sandbox_image", "verifier"}


def test_instances_are_stored_once_and_shared_between_versions(registry, project, owner):
    template = registry["task_template"]
    assert template.instance_set.count == 20
    spec_only = publish(project, owner, "task_template", "add-two", {**TEMPLATE_SPEC, "system_prompt": "Be exact."})
    assert spec_only.version.instance_set_id == template.instance_set_id
    more = publish(project, owner, "task_template", "add-two", TEMPLATE_SPEC, instances=addition_instances(25))
    assert more.version.number == 3 and more.version.instance_set.count == 25
    assert TaskInstance.objects.count() == 25 and InstanceSet.objects.count() == 2
    # Same instances in another order are the same set: the digest is over keys, not order.
    reordered = publish(project, owner, "task_template", "add-two", TEMPLATE_SPEC,
                        instances=list(reversed(addition_instances(25))))
    assert not reordered.created


def test_instance_problems_name_the_instance_and_field(registry, project, owner):
    bad = [{"key": "k1", "inputs": {"a": 1}}, {"key": "k1", "inputs": {"a": 1, "b": 2}}, {"key": "", "inputs": []}]
    with pytest.raises(SpecError) as caught:
        publish(project, owner, "task_template", "add-two", TEMPLATE_SPEC, instances=bad)
    messages = [str(e) for e in caught.value.errors]
    assert "instances[0].inputs: missing b (used by prompt_template)" in messages
    assert "instances[1].key: 'k1' appears twice" in messages
    assert any(m.startswith("instances[2].key: must be a non-empty string") for m in messages)
    assert "instances[2].inputs: must be a mapping of input names to values" in messages


def test_instances_page_by_key_without_gaps_or_repeats(registry):
    seen, after = [], ""
    while page := instance_page(version=registry["task_template"], after_key=after, limit=7):
        seen += [m.key for m in page]
        after = page[-1].key
    assert seen == sorted(i["key"] for i in addition_instances())


def test_aliases_move_with_an_audit_row_and_latest_is_reserved(registry, project, owner):
    v1 = registry["verifier"]
    v2 = publish(project, owner, "verifier", "numeric", {**VERIFIER_SPEC, "pass_threshold": 0.5}).version
    alias_move(version=v1, name="prod", actor=owner)
    alias_move(version=v2, name="prod", actor=owner)
    assert version_resolve(project=project, ref=Ref("verifier", "numeric", "prod")).number == 2
    moves = AuditEvent.objects.filter(action="alias.move").order_by("id")
    assert [m.details for m in moves] == [{"from": None, "to": 1}, {"from": 1, "to": 2}]
    with pytest.raises(SpecError, match="latest"):
        alias_move(version=v1, name="latest", actor=owner)
    assert version_resolve(project=project, ref=Ref("verifier", "numeric", "latest")).number == 2
    assert Alias.objects.count() == 1


def test_unknown_references_say_what_exists(registry, project):
    with pytest.raises(VersionNotFound, match="has versions 1..1"):
        version_resolve(project=project, ref=Ref("verifier", "numeric", "7"))
    with pytest.raises(VersionNotFound, match=r"has no alias 'prod' \(aliases: none\)"):
        version_resolve(project=project, ref=Ref("verifier", "numeric", "prod"))


def test_bundle_pins_the_whole_closure_and_does_not_drift(registry, project, owner):
    bundle = registry["bundle"]
    refs = [m["ref"] for m in bundle.spec["resolved"]]
    assert refs == ["domain/arithmetic@1", "sandbox_image/py-basic@1", "task_template/add-two@1", "verifier/numeric@1"]
    assert bundle.spec["members"] == ["domain/arithmetic@1"]  # @latest resolved on publish
    publish(project, owner, "verifier", "numeric", {**VERIFIER_SPEC, "pass_threshold": 0.5})
    # Re-publishing the same bundle spec keeps its lock: the verifier stays @1 ...
    again = publish(project, owner, "bundle", "arith-bundle", bundle.spec)
    assert not again.created
    # ... until the lock entry is removed.
    unlocked = {"members": bundle.spec["members"],
                "resolved": [m for m in bundle.spec["resolved"] if not m["ref"].startswith("verifier/")]}
    moved = publish(project, owner, "bundle", "arith-bundle", unlocked).version
    assert "verifier/numeric@2" in [m["ref"] for m in moved.spec["resolved"]]


def test_bundle_refuses_two_versions_of_one_definition_and_cycles(registry, project, owner):
    publish(project, owner, "verifier", "numeric", {**VERIFIER_SPEC, "pass_threshold": 0.5})
    with pytest.raises(SpecError, match="verifier/numeric is needed at @1 and @2"):
        publish(project, owner, "bundle", "mixed", {"members": ["bundle/arith-bundle@1", "verifier/numeric@2"]})
    with pytest.raises(SpecError, match="bundle cycle: arith-bundle -> bundle/arith-bundle@1"):
        publish(project, owner, "bundle", "arith-bundle", {"members": ["bundle/arith-bundle@1"]})


def test_changing_one_image_layer_invalidates_only_it_and_later_layers():
    layers = [{"type": "base", "image": "python-3.11"}, {"type": "system_packages", "packages": ["git"]},
              {"type": "python_packages", "packages": ["numpy==2.1.3"]}, {"type": "setup_script", "script": "true"}]
    changed = [*layers[:2], {"type": "python_packages", "packages": ["numpy==2.2.0"]}, layers[3]]
    before, after = layer_chain_hashes(layers), layer_chain_hashes(changed)
    assert before[:2] == after[:2] and before[2] != after[2] and before[3] != after[3]


# --- PostgreSQL: real concurrent connections -------------------------------------------------------------


def _in_threads(count: int, work) -> list:
    results, barrier = [None] * count, threading.Barrier(count)

    def run(index):
        try:
            barrier.wait()
            results[index] = work(index)
        except Exception as exc:  # reported by the assertion below
            results[index] = exc
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_parallel_publishes_never_share_a_number(project, owner):
    publish(project, owner, "sandbox_image", "py", IMAGE_SPEC)
    results = _in_threads(8, lambda i: publish(project, owner, "sandbox_image", "py",
                                               {**IMAGE_SPEC, "warm_pool_size": 10 + i}).version.number)
    assert sorted(results) == list(range(2, 10)), results
    numbers = list(Version.objects.filter(definition__slug="py").values_list("number", flat=True))
    assert sorted(numbers) == list(range(1, 10))
    parents = {v.number: v.parent.number for v in Version.objects.filter(number__gt=1).select_related("parent")}
    assert parents == {n: n - 1 for n in range(2, 10)}  # a straight line of history, no forks


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_parallel_identical_publishes_create_one_version(project, owner):
    results = _in_threads(8, lambda i: publish(project, owner, "sandbox_image", "fresh", IMAGE_SPEC).version.pk)
    assert all(isinstance(r, int) for r in results), results
    assert len(set(results)) == 1 and Version.objects.filter(definition__slug="fresh").count() == 1


def test_a_judge_score_range_must_go_from_low_to_high(project, owner):
    spec = {"layers": [{"name": "judge", "kind": "judge", "checks": [
        {"type": "score_model", "model": "m", "rubric": "r", "score_range": [10, 0]}]}]}
    with pytest.raises(SpecError, match=r"layers\[0\].checks\[0\].score_range: must go from low to high"):
        publish(project, owner, "verifier", "judged", spec)
