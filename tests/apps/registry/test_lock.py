"""A bundle version's lock (apps/registry/lock.py): parsed once on the version, and what every reader of what a
bundle pins reads — so after a newer version is published they all still name the pinned one."""


from apps.authoring.selectors import verifier_usage
from apps.registry.closure import dependents
from apps.registry.lock import BundleLock
from apps.registry.models import Version
from apps.registry.pins import bundle_tasks
from apps.registry.refs import Ref
from apps.registry.services import version_publish
from apps.runs.launch import first_step_estimate
from tests.support.specimens import TEMPLATE_SPEC, VERIFIER_SPEC
from workers.rl.config import GRPOConfig


def test_a_bundles_lock_pins_its_closure_exactly_and_is_parsed_once(registry):
    bundle = registry["bundle"]
    lock = bundle.lock
    assert bundle.lock is lock  # a version never changes: one parse serves every reader of this row
    assert lock.to_json() == bundle.spec["resolved"]  # the stored form, as the API shows it
    members = {f"{kind}/{version.definition.slug}": version for kind, version in registry.items() if kind != "bundle"}
    assert {p.name: (p.ref.number, p.content_hash) for p in lock.pinned} == {
        name: (version.number, version.content_hash) for name, version in members.items()}
    assert lock.number("verifier", "numeric") == 1 and lock.get("verifier", "other") is None
    assert [p.name for p in lock.of_kind("domain", "task_template")] == ["domain/arithmetic", "task_template/add-two"]
    # A floating reference takes the pinned version; an explicit number or an alias stays as written.
    assert lock.pin(Ref("verifier", "numeric")) == lock.pin(Ref("verifier", "numeric", "latest")) \
        == Ref("verifier", "numeric", "1")
    assert lock.pin(Ref("verifier", "numeric", "prod")) == Ref("verifier", "numeric", "prod")
    assert lock.pin(Ref("verifier", "other")) == Ref("verifier", "other")
    assert registry["domain"].lock == BundleLock()  # only a bundle pins


def test_every_reader_keeps_to_the_lock_after_newer_versions_are_published(registry, project, owner):
    def publish(kind, slug, spec):
        return version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner).version

    publish("verifier", "numeric", {**VERIFIER_SPEC, "pass_threshold": 0.5})
    publish("task_template", "add-two", {**TEMPLATE_SPEC, "limits": {**TEMPLATE_SPEC["limits"], "max_tokens": 99}})
    bundle = Version.objects.get(pk=registry["bundle"].pk)  # a fresh row: its lock parsed from the database

    [template] = bundle_tasks(bundle=bundle).templates.values()
    assert (template.key, template.verifier_key) == ("task_template/add-two@1", "verifier/numeric@1")
    estimate = first_step_estimate(bundle=bundle, config=GRPOConfig().to_dict())
    assert estimate.templates == [("task_template/add-two@1", 16, 1)] and estimate.domains == 1
    assert dependents(project=project, kind="verifier", slug="numeric")["pinned"] == [
        "bundle/arith-bundle@1 (pins verifier/numeric@1)"]
    verifier = registry["verifier"].definition
    assert verifier_usage(verifier=verifier)["bundles"] == ["bundle/arith-bundle@1 pins verifier/numeric@1"]
