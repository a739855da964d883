"""Environments as code: every definition as a readable YAML file, and back.

Layout of an export directory:

    project.yaml                          the project's slug and name
    <kind>/<slug>.yaml                    one file per definition (see FILE_HEADER)
    task_template/<slug>.instances.jsonl  the newest version's task instances, one JSON object per line
    task_template/<slug>.instances/<digest>.jsonl
                                          older instance sets that differ from the newest one
    dataset/<slug>.rows/<sha256>.jsonl    the rows each version of a dataset pins (dataset_store.py), by their hash
    dataset/<slug>.uploads/<sha256>.jsonl the uploaded files its sources name

`history` carries every version (number, message, content hash, spec) so an empty registry rebuilds the same
numbers, and bundles that pin `@N` still resolve. Authors and times stay in the registry: the files are the
environment, and a round trip export -> import -> export gives byte-identical files.

Import is all-or-nothing: every file is parsed and checked, every error is collected with its file and field,
and only when there are none is anything published, in one transaction.
"""

import hashlib
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from django.db import transaction

from apps.accounts.models import Project, Team
from apps.accounts.services import audit_record, project_create
from workers.definitions.canonical import MAX_DEPTH, data_problem
from workers.definitions.specs import KINDS, PUBLISH_ORDER, SLUG_RE, validate_spec

from .dataset_store import jsonl_read, jsonl_store, rows_key, upload_key
from .errors import FieldError, PublishConflict, SpecError, VersionNotFound
from .models import Alias, Definition, InstanceSetMember, Version
from .refs import parse_ref
from .selectors import instance_rows
from .services import Published, alias_move, version_publish

FILE_HEADER = (
    "# Posttrain Studio definition. Edit `spec` or `description` (task instances: the .instances.jsonl file),\n"
    "# then run `manage.py registry import DIR`: what changed becomes a new version. `history` is read-only.\n"
)
FILE_KEYS = {"kind", "slug", "description", "spec", "instances", "aliases", "history"}
HISTORY_KEYS = {"number", "message", "content_hash", "instances", "spec"}
MAX_FILE_BYTES = 64 * 1024 * 1024


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (prompts, test code, scripts) as literal blocks, so the files read like code; no
    anchors: a reader should never have to chase `*id001` back to where it was defined."""

    def ignore_aliases(self, data) -> bool:
        return True


# libyaml's C loader when present: a 10 MB file parses in a fraction of the pure-Python time.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _str_representer(dumper, value: str):
    style = "|" if "\n" in value and all(line == line.rstrip() for line in value.split("\n")) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


class YamlError(ValueError):
    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line  # 1-based, where the parser stopped; None when it cannot say


def load_yaml(text: str):
    """Parse YAML written by a person; anchors and aliases are refused, since a few kilobytes of nested
    aliases expand to gigabytes once validated and hashed."""
    try:
        value = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise YamlError(f"malformed YAML: {where}{getattr(exc, 'problem', None) or exc}",
                        line=mark.line + 1 if mark else None) from None
    except RecursionError:
        raise YamlError(f"the YAML is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # a value the loader cannot build: an integer of more than 4,300 digits
        raise YamlError(f"a value cannot be read: {exc}") from None
    except (IndexError, KeyError, AttributeError, TypeError) as exc:
        # A tagged scalar PyYAML's constructors cannot build (`!!int ''`, `!!timestamp x`): they fail with
        # whatever error comes first.
        raise YamlError(f"a tagged value cannot be built ({type(exc).__name__}: {exc})") from None
    seen, stack = set(), [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict | list):
            if id(node) in seen:
                raise YamlError("YAML anchors and aliases (&name, *name) are not allowed; write the value out")
            seen.add(id(node))
            stack.extend(node.values() if isinstance(node, dict) else node)
    problem = data_problem(value)
    if problem:
        raise YamlError(problem)
    return value


_FIELD_PART = re.compile(r"\[(\d+)\]|\.?([^.\[]+)")


def field_lines(text: str, fields: list[str]) -> list[int | None]:
    """The 1-based line of each field path (`layers[0].checks[1].weight`, as FieldError names them) in the YAML
    text: where its key is written, or where the nearest written parent is for a missing field; None when the
    text does not parse. The editor puts each error at its line with this."""
    try:
        root = yaml.compose(text, Loader=_Loader)
    except (yaml.YAMLError, RecursionError, ValueError):
        return [None] * len(fields)
    lines = []
    for path in fields:
        node, line = root, (root.start_mark.line + 1 if root is not None else 1)
        for index, key in _FIELD_PART.findall(path):
            if isinstance(node, yaml.SequenceNode) and index and int(index) < len(node.value):
                node = node.value[int(index)]
                line = node.start_mark.line + 1
            elif isinstance(node, yaml.MappingNode) and key:
                found = next(((k, v) for k, v in node.value if getattr(k, "value", None) == key), None)
                if found is None:
                    break
                line, node = found[0].start_mark.line + 1, found[1]
            else:
                break
        lines.append(line)
    return lines


def dump_yaml(data) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110, default_flow_style=False)


def _jsonl(rows) -> str:
    return "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows)


# --- export -----------------------------------------------------------------------------------------------


# Instance sets up to this size are read together, a batch of definitions at a time (a project of a thousand small
# templates in a few queries); larger ones a chunk at a time each, so an export never holds more than this many.
_READ_TOGETHER = 2000
_DEFINITIONS_PER_BATCH = 200


def export_project(*, project: Project, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / "project.yaml"]
    written[0].write_text(dump_yaml({"slug": project.slug, "name": project.name, "team": project.team.slug}))
    definitions = list(Definition.objects.filter(project=project).order_by("kind", "slug"))
    versions: dict[int, list[Version]] = defaultdict(list)
    for version in (Version.objects.filter(definition__project=project).select_related("instance_set")
                    .order_by("definition_id", "number")):
        versions[version.definition_id].append(version)
    aliases: dict[int, dict[str, int]] = defaultdict(dict)
    for definition_id, name, number in (Alias.objects.filter(definition__project=project).order_by("name")
                                        .values_list("definition_id", "name", "version__number")):
        aliases[definition_id][name] = number
    for start in range(0, len(definitions), _DEFINITIONS_PER_BATCH):
        batch = definitions[start:start + _DEFINITIONS_PER_BATCH]
        small = {v.instance_set_id for d in batch for v in versions[d.pk]
                 if v.instance_set_id is not None and v.instance_set.count <= _READ_TOGETHER}
        read = _instance_sets_read(small)
        for definition in batch:
            written += _export_definition(definition, directory / definition.kind, versions=versions[definition.pk],
                                          aliases=aliases[definition.pk], read=read)
    return written


def _instance_sets_read(instance_sets: set[int]) -> dict[int, list[dict]]:
    """The rows of several instance sets in one query, each set's in key order."""
    read: dict[int, list[dict]] = {instance_set: [] for instance_set in instance_sets}
    for instance_set, key, inputs, hidden in (
            InstanceSetMember.objects.filter(instance_set_id__in=instance_sets).order_by("instance_set_id", "key")
            .values_list("instance_set_id", "key", "instance__inputs", "instance__hidden")):
        read[instance_set].append({"key": key, "inputs": inputs, "hidden": hidden})
    return read


def _instances_rows(instance_set_id, read: dict[int, list[dict]]):
    if instance_set_id in read:
        return read[instance_set_id]
    rows = instance_rows(version=Version(instance_set_id=instance_set_id))
    return ({"key": key, "inputs": inputs, "hidden": hidden} for key, inputs, hidden in rows)


def _export_definition(definition: Definition, folder: Path, *, versions: list[Version], aliases: dict[str, int],
                       read: dict[int, list[dict]]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    head = versions[-1]
    written = []
    doc = {"kind": definition.kind, "slug": definition.slug, "description": definition.description,
           "spec": head.spec}
    history = []
    if definition.kind == "task_template":
        head_file = f"{definition.slug}.instances.jsonl"
        doc["instances"] = head_file
        path = folder / head_file
        path.write_text(_jsonl(_instances_rows(head.instance_set_id, read)))
        written.append(path)
    for version in versions:
        entry = {"number": version.number, "message": version.message, "content_hash": version.content_hash}
        if version.instance_set_id is not None:
            if version.instance_set_id == head.instance_set_id:
                entry["instances"] = f"{definition.slug}.instances.jsonl"
            else:
                entry["instances"] = f"{definition.slug}.instances/{version.instance_set.digest}.jsonl"
                path = folder / entry["instances"]
                if not path.exists():
                    path.parent.mkdir(exist_ok=True)
                    path.write_text(_jsonl(_instances_rows(version.instance_set_id, read)))
                    written.append(path)
        entry["spec"] = version.spec
        history.append(entry)
    if definition.kind == "dataset":
        written += _export_dataset_rows(definition.slug, [version.spec for version in versions], folder)
    doc["aliases"] = aliases
    doc["history"] = history
    path = folder / f"{definition.slug}.yaml"
    path.write_text(FILE_HEADER + dump_yaml(doc))
    return [path] + written


def _dataset_blobs(slug: str, spec: dict) -> list[tuple[str, str, object]]:
    """(file name next to the definition, sha256, its blob key function) of each stored JSONL a dataset spec pins:
    its rows and the uploads its sources name."""
    blobs = [(f"{slug}.rows/{spec.get('content_sha256')}.jsonl", spec.get("content_sha256"), rows_key)]
    blobs += [(f"{slug}.uploads/{source['sha256']}.jsonl", source["sha256"], upload_key)
              for source in spec.get("sources", []) if isinstance(source, dict) and source.get("type") == "upload"]
    return blobs


def _export_dataset_rows(slug: str, specs: list[dict], folder: Path) -> list[Path]:
    written = []
    for spec in specs:
        for name, sha256, key_of in _dataset_blobs(slug, spec):
            path = folder / name
            if not path.exists():
                path.parent.mkdir(exist_ok=True)
                path.write_bytes(jsonl_read(sha256, key_of=key_of))
                written.append(path)
    return written


def _import_dataset_rows(item) -> None:
    """Store the rows and uploads the dataset's files carry, each checked against the hash it is named by, before
    its versions are published (a publish checks that they are stored)."""
    for spec in [entry["spec"] for entry in item.history] + [item.spec]:
        if not isinstance(spec, dict):
            continue
        for name, sha256, key_of in _dataset_blobs(item.slug, spec):
            path = item.path.parent / name
            if not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", sha256) or not path.is_file():
                continue  # publishing says what is missing, unless this studio stores it already
            content = path.read_bytes()
            if hashlib.sha256(content).hexdigest() != sha256:
                raise SpecError([FieldError("content_sha256", f"{name} does not hash to the {sha256[:12]}… it is "
                                                              "named by: it was changed")])
            jsonl_store(content, key_of=key_of)


# --- import -----------------------------------------------------------------------------------------------


@dataclass
class FileError:
    file: str
    field: str
    problem: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field + ': ' if self.field else ''}{self.problem}"


class ImportFailed(Exception):
    def __init__(self, errors: list[FileError]):
        self.errors = errors
        super().__init__(f"{len(errors)} error(s); nothing was imported")


@dataclass
class DefinitionFile:
    path: Path
    name: str  # relative path, for messages
    kind: str
    slug: str
    description: str
    spec: dict
    instances: list[dict] | None
    aliases: dict[str, int]
    history: list[dict]
    history_instances: dict[int, list[dict]] = field(default_factory=dict)


@dataclass
class ImportReport:
    published: list[str] = field(default_factory=list)  # refs of new versions
    unchanged: list[str] = field(default_factory=list)
    aliases_moved: list[str] = field(default_factory=list)
    project_created: bool = False


def import_directory(*, directory: Path, project_slug: str | None, actor=None, message: str = "") -> ImportReport:
    """Parse and check every file, then publish what changed in one transaction; raises ImportFailed."""
    errors: list[FileError] = []
    project_doc = _read_project_file(directory, errors)
    slug = project_slug or (project_doc or {}).get("slug")
    if not slug:
        errors.append(FileError("project.yaml", "slug", "missing; pass --project SLUG or add project.yaml"))
    files = _read_definition_files(directory, errors)
    ordered = _publish_order(files, errors)
    if not slug:
        raise ImportFailed(errors)

    # Even when some files failed to parse, the others are published inside the transaction, so that errors
    # only publishing reveals (a reference to nothing) are listed too; any error rolls everything back.
    report = ImportReport()
    with transaction.atomic():
        project = Project.objects.filter(slug=slug).first()
        if project is None:
            project = _project_create(slug=slug, doc=project_doc or {}, actor=actor)
            report.project_created = True
        for item in ordered:
            try:
                with transaction.atomic():
                    _import_one(item, project=project, actor=actor, message=message, report=report)
            except SpecError as exc:
                errors += [FileError(item.name, _spec_field(e.field), e.problem) for e in exc.errors]
            except (VersionNotFound, PublishConflict, ValueError) as exc:
                errors.append(FileError(item.name, "", str(exc)))
        if errors:
            transaction.set_rollback(True)
    if errors:
        raise ImportFailed(errors)
    return report


def _project_create(*, slug: str, doc: dict, actor) -> Project:
    """The importing user owns a project the import creates; without one it has no members until an owner
    is added (`manage.py createsuperuser` can reach it through /admin/)."""
    team, name = str(doc.get("team", slug)), str(doc.get("name", slug))
    if actor is not None:
        return project_create(team_slug=team, slug=slug, name=name, owner=actor, via="cli")
    team_row, _ = Team.objects.get_or_create(slug=team, defaults={"name": team})
    project = Project(team=team_row, slug=slug, name=name)
    project.full_clean()
    project.save()
    audit_record(project=project, actor=None, action="project.create", target=f"project/{slug}", via="cli")
    return project


def _spec_field(name: str) -> str:
    if name == "spec" or name.startswith(("instances", "slug", "history", "aliases")):
        return name
    return f"spec.{name}"


def _import_one(item: DefinitionFile, *, project, actor, message, report: ImportReport) -> None:
    if item.kind == "dataset":
        _import_dataset_rows(item)
    definition = Definition.objects.filter(project=project, kind=item.kind, slug=item.slug).first()
    existing = {v.number: v for v in Version.objects.filter(definition=definition)} if definition else {}
    rebuilt = None  # the newest version published from history here, if any
    for entry in item.history:
        number = entry["number"]
        if number in existing:
            if existing[number].content_hash != entry["content_hash"]:
                raise ValueError(f"history @{number} differs from the registry's {item.kind}/{item.slug}@{number}; "
                                 "history is read-only: edit `spec` instead")
            continue
        published = version_publish(project=project, kind=item.kind, slug=item.slug, spec=entry["spec"],
                                     author=actor, message=entry["message"], description=item.description,
                                     instances=item.history_instances.get(number), expected_head=number - 1,
                                     via="cli")
        if published.version.content_hash != entry["content_hash"]:
            raise ValueError(f"history @{number}: its spec hashes to {published.version.content_hash[:12]}, "
                             f"not the recorded {entry['content_hash'][:12]}; history is read-only")
        report.published.append(published.version.ref)
        rebuilt = (entry, published)
    if rebuilt is not None and rebuilt[0] is item.history[-1] and rebuilt[0]["spec"] == item.spec \
            and item.instances is item.history_instances.get(rebuilt[0]["number"]):
        # The file's spec is its newest version's, just published from history: publishing it again would check
        # it all again (a bundle's whole closure) to find it unchanged.
        published = Published(rebuilt[1].version, created=False)
    else:
        published = version_publish(project=project, kind=item.kind, slug=item.slug, spec=item.spec, author=actor,
                                    message=message or f"Imported from {item.name}", description=item.description,
                                    instances=item.instances, via="cli")
    if published.created:
        report.published.append(published.version.ref)
    elif published.version.ref not in report.published:  # not just rebuilt from history
        report.unchanged.append(published.version.ref)
    for name, number in item.aliases.items():
        target = Version.objects.select_related("definition").filter(
            definition=published.version.definition, number=number).first()
        if target is None:
            raise SpecError([FieldError("aliases", f"{name} points at @{number}, which does not exist")])
        before = Alias.objects.filter(definition=target.definition, name=name).values_list("version_id", flat=True)
        if list(before) != [target.pk]:
            alias_move(version=target, name=name, actor=actor, via="cli")
            report.aliases_moved.append(f"{item.kind}/{item.slug}@{name} -> {number}")


def _read_project_file(directory: Path, errors: list[FileError]) -> dict | None:
    path = directory / "project.yaml"
    if not path.exists():
        return None
    doc = _load_yaml(path, "project.yaml", errors)
    if doc is not None and not isinstance(doc, dict):
        errors.append(FileError("project.yaml", "", "must be a mapping with slug and name"))
        return None
    return doc


def _load_yaml(path: Path, name: str, errors: list[FileError]):
    if path.stat().st_size > MAX_FILE_BYTES:
        errors.append(FileError(name, "", f"is {path.stat().st_size / 1e6:.0f} MB; the limit is "
                                          f"{MAX_FILE_BYTES / 1e6:.0f} MB"))
        return None
    try:
        return load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        errors.append(FileError(name, "", "is not UTF-8 text"))
    except YamlError as exc:
        errors.append(FileError(name, "", str(exc)))
    return None


def _read_definition_files(directory: Path, errors: list[FileError]) -> list[DefinitionFile]:
    if not directory.is_dir():
        errors.append(FileError(str(directory), "", "is not a directory"))
        return []
    files = []
    for path in sorted(directory.glob("*/*.yaml")):
        name = str(path.relative_to(directory))
        if path.parent.name not in KINDS:
            errors.append(FileError(name, "", f"folder {path.parent.name!r} is not a kind ({', '.join(KINDS)})"))
            continue
        before = len(errors)
        doc = _load_yaml(path, name, errors)
        if len(errors) > before:
            continue
        parsed = _parse_definition(doc, path, name, errors)
        if parsed:
            files.append(parsed)
    if not files and not errors:
        errors.append(FileError(str(directory), "", "holds no definition files (<kind>/<slug>.yaml)"))
    return files


def _parse_definition(doc, path: Path, name: str, errors: list[FileError]) -> DefinitionFile | None:
    def fail(field_name: str, problem: str) -> None:
        errors.append(FileError(name, field_name, problem))

    if not isinstance(doc, dict):
        fail("", "must be a mapping with kind, slug, spec")
        return None
    for unknown in sorted(set(doc) - FILE_KEYS, key=str):
        fail(str(unknown), f"unknown field; allowed: {', '.join(sorted(FILE_KEYS))}")
    kind, slug = doc.get("kind"), doc.get("slug")
    if kind != path.parent.name:
        fail("kind", f"is {kind!r} but the file sits in {path.parent.name}/")
    if not isinstance(slug, str) or not re.fullmatch(SLUG_RE, slug):
        fail("slug", f"{slug!r} is not a slug (lowercase letters, digits, hyphens; no '/', '.', spaces)")
    elif slug != path.stem:
        fail("slug", f"is {slug!r} but the file is named {path.name}")
    description = doc.get("description") or ""
    if not isinstance(description, str):
        fail("description", "must be text")
    spec = doc.get("spec")
    try:
        validate_spec(path.parent.name, spec)
    except SpecError as exc:
        for e in exc.errors:
            fail(f"spec.{e.field}" if e.field != "spec" else "spec", e.problem)
    aliases = doc.get("aliases") or {}
    if not isinstance(aliases, dict) or not all(isinstance(n, int) and n > 0 for n in aliases.values()):
        fail("aliases", "must map alias names to version numbers")
        aliases = {}
    history = doc.get("history") or []
    if not isinstance(history, list):
        fail("history", "must be a list of versions")
        history = []
    item = DefinitionFile(path=path, name=name, kind=path.parent.name, slug=str(slug), description=str(description),
                          spec=spec if isinstance(spec, dict) else {}, instances=None, aliases=aliases, history=[])
    instance_files: dict[str, list[dict] | None] = {}
    if doc.get("instances") is not None:
        item.instances = _read_instances(path.parent, doc["instances"], name, "instances", errors, instance_files)
    for index, entry in enumerate(history):
        where = f"history[{index}]"
        if (not isinstance(entry, dict) or set(entry) - HISTORY_KEYS
                or not {"number", "content_hash", "spec"} <= set(entry)):
            fail(where, "must be a mapping with number, message, content_hash, spec (and instances)")
            continue
        if entry["number"] != index + 1:
            fail(f"{where}.number", f"is {entry['number']!r}; history lists versions 1, 2, 3... in order")
            continue
        if entry.get("instances") is not None:
            rows = _read_instances(path.parent, entry["instances"], name, f"{where}.instances", errors, instance_files)
            item.history_instances[entry["number"]] = rows
        item.history.append({"number": entry["number"], "message": entry.get("message") or "",
                             "content_hash": entry["content_hash"], "spec": entry["spec"]})
    return item


def _read_instances(folder: Path, relative, name: str, where: str, errors: list[FileError],
                    cache: dict[str, list[dict] | None]) -> list[dict] | None:
    if relative in cache:
        return cache[relative]
    if not isinstance(relative, str) or relative.startswith("/") or ".." in relative.split("/"):
        errors.append(FileError(name, where, f"{relative!r} must be a file name next to the definition"))
        return None
    path = folder / relative
    if not path.is_file():
        errors.append(FileError(name, where, f"{relative} does not exist"))
        return None
    rows, shown = [], f"{path.parent.name}/{relative}"
    try:
        with path.open(encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                problem = None
                try:
                    row = json.loads(line)
                    problem = data_problem(row)
                except json.JSONDecodeError as exc:
                    problem = f"not JSON: {exc.msg}"
                except RecursionError:
                    problem = f"nested deeper than {MAX_DEPTH} levels"
                except ValueError as exc:  # what json refuses beyond the grammar: an integer of 4,300+ digits
                    problem = f"a value cannot be read: {exc}"
                if problem:
                    errors.append(FileError(shown, f"line {line_number}", problem))
                    if len(errors) > 50:
                        break
                else:
                    rows.append(row)
    except UnicodeDecodeError as exc:
        errors.append(FileError(shown, "", f"is not UTF-8 text ({exc.reason} at byte {exc.start})"))
    cache[relative] = rows
    return rows


def _publish_order(files: list[DefinitionFile], errors: list[FileError]) -> list[DefinitionFile]:
    """Kinds in dependency order; bundles after the bundles they include. A cycle of bundles is an error."""
    by_kind = {kind: [f for f in files if f.kind == kind] for kind in PUBLISH_ORDER}
    bundles = {f.slug: f for f in by_kind["bundle"]}
    ordered_bundles: list[DefinitionFile] = []
    state: dict[str, str] = {}

    def visit(slug: str, path: list[str]) -> None:
        if state.get(slug) == "done":
            return
        if state.get(slug) == "visiting":
            cycle = path[path.index(slug):] + [slug]
            errors.append(FileError(f"bundle/{slug}.yaml", "spec.members", f"bundle cycle: {' -> '.join(cycle)}"))
            return
        state[slug] = "visiting"
        for member in bundles[slug].spec.get("members", []):
            try:
                ref = parse_ref(member)
            except VersionNotFound:
                continue  # reported by validation already
            if ref.kind == "bundle" and ref.slug in bundles:
                visit(ref.slug, path + [slug])
        state[slug] = "done"
        ordered_bundles.append(bundles[slug])

    for slug in sorted(bundles):
        visit(slug, [])
    return [f for kind in PUBLISH_ORDER[:-1] for f in by_kind[kind]] + ordered_bundles
