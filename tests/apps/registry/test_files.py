"""Environments as code: export, import, diff through the real management command and database."""

from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from apps.accounts.models import AuditEvent
from apps.registry.models import Alias, Definition, TaskInstance, Version
from apps.registry.services import alias_move


def export(directory: Path, project: str = "acme-rl") -> dict[str, bytes]:
    call_command("registry", "export", str(directory), "--project", project)
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def wipe_registry():
    """An empty database as far as the registry goes (versions are immutable, so go through raw SQL)."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table in ["registry_alias", "registry_version", "registry_instancesetmember", "registry_taskinstance",
                      "registry_instanceset", "registry_definition", "accounts_auditevent", "accounts_membership",
                      "accounts_project", "accounts_team"]:
            cursor.execute(f"DELETE FROM {table}")


@pytest.fixture
def exported(registry, project, owner, tmp_path):
    # A second version and an alias so history and aliases round-trip too.
    from apps.registry.services import version_publish

    spec = dict(registry["verifier"].spec)
    spec["pass_threshold"] = 0.5
    v2 = version_publish(project=project, kind="verifier", slug="numeric", spec=spec, author=owner,
                         message="looser").version
    alias_move(version=registry["verifier"], name="prod", actor=owner)
    assert v2.number == 2
    return tmp_path / "a", export(tmp_path / "a")


def test_export_writes_one_readable_file_per_definition(exported):
    directory, files = exported
    assert sorted(f for f in files if f.endswith(".yaml")) == [
        "bundle/arith-bundle.yaml", "domain/arithmetic.yaml", "project.yaml", "sandbox_image/py-basic.yaml",
        "task_template/add-two.yaml", "verifier/numeric.yaml"]
    doc = yaml.safe_load(files["verifier/numeric.yaml"])
    assert doc["spec"]["pass_threshold"] == 0.5
    assert [h["number"] for h in doc["history"]] == [1, 2]
    assert doc["aliases"] == {"prod": 1}
    lines = files["task_template/add-two.instances.jsonl"].decode().splitlines()
    assert len(lines) == 20 and '"key": "add-00000"' in lines[0]


def test_round_trip_through_an_empty_database_gives_identical_files(exported, tmp_path):
    directory, first = exported
    wipe_registry()
    call_command("registry", "import", str(directory))
    assert Version.objects.count() == 6
    second = export(tmp_path / "b")
    assert second == first


def test_reimporting_the_same_directory_creates_nothing(exported):
    directory, _ = exported
    versions, instances, audits = Version.objects.count(), TaskInstance.objects.count(), AuditEvent.objects.count()
    call_command("registry", "import", str(directory))
    assert (Version.objects.count(), TaskInstance.objects.count(), AuditEvent.objects.count()) == (
        versions, instances, audits)


def test_changing_one_field_creates_one_version_and_diff_shows_it(exported, capsys):
    directory, _ = exported
    path = directory / "task_template" / "add-two.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["limits"]["max_tokens"] = 32
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = Version.objects.count()
    call_command("registry", "import", str(directory), "--message", "longer answers")
    assert Version.objects.count() == before + 1
    new = Version.objects.get(definition__slug="add-two", number=2)
    assert new.parent.number == 1 and new.message == "longer answers"
    assert new.instance_set_id == new.parent.instance_set_id  # instances unchanged: shared, not copied
    capsys.readouterr()
    call_command("registry", "diff", "task_template/add-two@1", "2")
    out = capsys.readouterr().out
    assert "1 change(s)" in out and "~ limits.max_tokens: 16 -> 32" in out


def test_editing_instances_publishes_a_new_version_with_a_new_set(exported):
    directory, _ = exported
    path = directory / "task_template" / "add-two.instances.jsonl"
    path.write_text(path.read_text() + '{"key": "add-99999", "inputs": {"a": 1, "b": 1}, "hidden": {"answer": 2}}\n')
    call_command("registry", "import", str(directory))
    head = Version.objects.filter(definition__slug="add-two").order_by("-number").first()
    assert head.number == 2 and head.instance_set.count == 21
    assert TaskInstance.objects.filter(definition__slug="add-two").count() == 21  # old 20 reused


def bad_files(directory: Path) -> dict[str, str]:
    return {
        "verifier/broken.yaml": "kind: verifier\nslug: broken\nspec: {layers: [unclosed\n",
        "verifier/typo.yaml": "kind: verifier\nslug: typo\nspec:\n  layerz: []\n",
        "verifier/wrong-type.yaml": "kind: verifier\nslug: wrong-type\nspec:\n  layers:\n  - name: exact\n"
                                    "    kind: exact\n    checks: [{type: numeric, weight: heavy}]\n",
        "domain/dangling.yaml": "kind: domain\nslug: dangling\nspec:\n  templates: [{template: nowhere}]\n",
    }


def test_import_is_all_or_nothing_and_lists_every_error(exported, capsys):
    directory, _ = exported
    doc = yaml.safe_load((directory / "verifier" / "numeric.yaml").read_text())
    doc["spec"]["pass_threshold"] = 0.25  # a valid change that must NOT be published
    (directory / "verifier" / "numeric.yaml").write_text(yaml.safe_dump(doc))
    for name, text in bad_files(directory).items():
        (directory / name).write_text(text)
    before = Version.objects.count(), Definition.objects.count(), AuditEvent.objects.count()
    with pytest.raises(CommandError, match="nothing was imported"):
        call_command("registry", "import", str(directory))
    err = capsys.readouterr().err
    assert "verifier/broken.yaml: malformed YAML: line 4" in err
    assert "verifier/typo.yaml: spec.layerz: unknown field" in err
    assert "verifier/wrong-type.yaml: spec.layers[0].checks[0].weight: Input should be a valid number" in err
    assert "domain/dangling.yaml: spec.templates[0].template: No task_template named 'nowhere'" in err
    assert (Version.objects.count(), Definition.objects.count(), AuditEvent.objects.count()) == before


def test_slug_with_path_characters_and_mismatched_names_are_refused(exported, capsys):
    directory, _ = exported
    (directory / "verifier" / "evil.yaml").write_text(
        "kind: verifier\nslug: ../../etc\nspec: {layers: [{name: a, kind: exact, checks: [{type: numeric}]}]}\n")
    (directory / "domain" / "elsewhere.yaml").write_text(
        "kind: verifier\nslug: elsewhere\nspec: {templates: [{template: add-two}]}\n")
    with pytest.raises(CommandError):
        call_command("registry", "import", str(directory))
    err = capsys.readouterr().err
    assert "verifier/evil.yaml: slug: '../../etc' is not a slug" in err
    assert "domain/elsewhere.yaml: kind: is 'verifier' but the file sits in domain/" in err


def test_a_cycle_of_bundles_is_refused(exported, capsys):
    directory, _ = exported
    for slug, other in (("ring-a", "ring-b"), ("ring-b", "ring-a")):
        (directory / "bundle" / f"{slug}.yaml").write_text(
            f"kind: bundle\nslug: {slug}\nspec: {{members: [bundle/{other}@latest]}}\n")
    before = Version.objects.count()
    with pytest.raises(CommandError):
        call_command("registry", "import", str(directory))
    assert "bundle cycle: ring-a -> ring-b -> ring-a" in capsys.readouterr().err
    assert Version.objects.count() == before


def test_oversized_spec_is_refused_with_its_size(exported, capsys):
    directory, _ = exported
    big = "x" * (10 * 1024 * 1024)
    (directory / "sandbox_image" / "huge.yaml").write_text(
        "kind: sandbox_image\nslug: huge\nspec:\n  layers:\n  - {type: base, image: python-3.11}\n"
        f"  - type: setup_script\n    script: {big}\n")
    with pytest.raises(CommandError):
        call_command("registry", "import", str(directory))
    assert "sandbox_image/huge.yaml: spec: is 10.5 MB; the limit is 1 MB" in capsys.readouterr().err
    assert not Definition.objects.filter(slug="huge").exists()


def test_edited_history_is_refused(exported, capsys):
    directory, _ = exported
    path = directory / "verifier" / "numeric.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["history"][0]["content_hash"] = "0" * 64
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(CommandError):
        call_command("registry", "import", str(directory))
    assert "history @1 differs" in capsys.readouterr().err


def test_import_moves_aliases_and_audits_the_move(exported):
    directory, _ = exported
    path = directory / "verifier" / "numeric.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["aliases"]["prod"] = 2
    path.write_text(yaml.safe_dump(doc))
    call_command("registry", "import", str(directory))
    assert Alias.objects.get(name="prod").version.number == 2
    move = AuditEvent.objects.filter(action="alias.move").latest("created_at")
    assert move.details == {"from": 1, "to": 2} and move.via == "cli"


def test_diff_of_unknown_version_is_a_clear_error(registry):
    with pytest.raises(CommandError, match="verifier/numeric@9 does not exist; verifier/numeric has versions 1..1"):
        call_command("registry", "diff", "verifier/numeric@1", "9", "--project", "acme-rl")


def test_yaml_anchors_are_refused_before_they_can_expand(exported, capsys):
    directory, _ = exported
    bomb = "a: &a [x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(20))
    (directory / "verifier" / "bomb.yaml").write_text(
        "kind: verifier\nslug: bomb\nspec:\n  layers:\n  - name: exact\n    kind: exact\n    checks:\n"
        "    - type: json_schema\n      json_schema:\n"
        + "".join("        " + line + "\n" for line in bomb.splitlines()))
    with pytest.raises(CommandError):
        call_command("registry", "import", str(directory))
    assert "verifier/bomb.yaml: YAML anchors and aliases (&name, *name) are not allowed" in capsys.readouterr().err


def test_import_into_an_empty_database_makes_the_importing_user_owner(exported, owner):
    directory, _ = exported
    wipe_registry()
    call_command("registry", "import", str(directory), "--user", owner.username)
    from apps.accounts.models import Membership

    membership = Membership.objects.get(project__slug="acme-rl")
    assert membership.user == owner and membership.role == "owner"
    assert AuditEvent.objects.filter(action="project.create", via="cli", actor=owner).count() == 1
    assert Version.objects.filter(author=owner).count() == 6


# --- files no person meant to write: not UTF-8, nested past any spec, numbers no JSON holds ----------------


def import_fails(directory: Path, capsys) -> list[str]:
    """The problems `registry import` lists for `directory`, after checking that it refused and published
    nothing."""
    before = Version.objects.count(), Definition.objects.count(), TaskInstance.objects.count(), \
        AuditEvent.objects.count()
    capsys.readouterr()
    with pytest.raises(CommandError, match="nothing was imported"):
        call_command("registry", "import", str(directory))
    assert (Version.objects.count(), Definition.objects.count(), TaskInstance.objects.count(),
            AuditEvent.objects.count()) == before
    return [line.strip() for line in capsys.readouterr().err.splitlines()]


def test_an_instances_file_that_is_not_utf8_is_named(exported, capsys):
    directory, _ = exported
    path = directory / "task_template" / "add-two.instances.jsonl"
    text = path.read_bytes()
    path.write_bytes(text + b'{"key": "latin-1", "inputs": {"a": "caf\xe9", "b": 1}, "hidden": {"answer": 1}}\n')
    problems = import_fails(directory, capsys)
    at = len(text) + len(b'{"key": "latin-1", "inputs": {"a": "caf')
    assert f"task_template/add-two.instances.jsonl: is not UTF-8 text (invalid continuation byte at byte {at})" \
        in problems, problems


def test_a_spec_nested_3000_levels_is_named(exported, capsys):
    directory, _ = exported
    (directory / "verifier" / "deep.yaml").write_text(
        "kind: verifier\nslug: deep\nspec:\n  layers:\n  - name: exact\n    kind: exact\n    checks:\n"
        "    - type: json_schema\n      json_schema: " + "{a: " * 2999 + "1" + "}" * 2999 + "\n")
    problems = import_fails(directory, capsys)
    deep = [p for p in problems if p.startswith("verifier/deep.yaml: ")]
    assert len(deep) == 1 and deep[0].endswith("is nested deeper than 64 levels"), problems
    assert "spec.layers[0].checks[0].json_schema.a.a" in deep[0]


@pytest.mark.parametrize("line, problem", [
    ('{"key": "deep", "inputs": {"a": ' + "[" * 3000 + "]" * 3000 + ', "b": 1}, "hidden": {}}',
     "nested deeper than 64 levels"),
    ('{"key": "surrogate", "inputs": {"a": "\\ud800", "b": 1}, "hidden": {}}', "inputs.a holds a lone surrogate"),
    ('{"key": "huge", "inputs": {"a": 1' + "0" * 30 + ', "b": 1}, "hidden": {}}',
     "inputs.a holds an integer beyond 64 bits"),
    ('{"key": "huger", "inputs": {"a": 1' + "0" * 5000 + ', "b": 1}, "hidden": {}}', "a value cannot be read"),
], ids=["nested-3000", "surrogate", "31-digit-integer", "5001-digit-integer"])
def test_an_instance_line_no_task_can_hold_is_named_by_its_line(exported, capsys, line, problem):
    directory, _ = exported
    path = directory / "task_template" / "add-two.instances.jsonl"
    path.write_text(path.read_text() + line + "\n")
    problems = import_fails(directory, capsys)
    named = [p for p in problems if p.startswith("task_template/add-two.instances.jsonl: line 21: ")]
    assert len(named) == 1 and problem in named[0], problems
