"""Task files uploaded in the browser, and reading them (the "import job"), before anything is published.

An upload is a directory under STUDIO_DATA_DIR/uploads/tasks/<id>/: the file as it arrived (streamed there in
chunks by the upload page's handler, never held whole in memory), `meta.json` (who uploaded it for which task
template, its name and size), and one job per way of reading it (a format, a column mapping, the template
version whose prompt renders the rows) under jobs/<key>/: `params.json`, `state.json` (running with its
progress, done with every error and the first rows rendered, or failed) and, where the file was read to its end,
`instances.jsonl`, its good rows, which publishing stores (all of the file's, or with the bad rows left out when
the uploader asks for that), with `hashes.json`, each of those task's content hash by key (what the preview
compares with the head version's tasks).

A small file is read in the request. A file above settings.TASK_UPLOAD_BACKGROUND_BYTES (default 20 MB) is read
in the background while the page polls its progress: by the Celery task `workers.tasks.read_task_upload` on the
`studio` queue when the studio runs on services (the `studio-worker` of docker-compose.yml, which mounts the web
server's data volume: the file is there), or by a thread of the web process in the embedded studio, which has no
broker. A job whose reader died (its state not updated for STALE_SECONDS) is started again when the page next
asks.

Nothing here touches the database: publishing is the page's, through the registry's services.version_publish.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import string
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from workers.definitions.canonical import instance_hash
from workers.definitions.specs import Limits, VerifierSpec, parse_spec
from workers.rl.types import TaskTemplate
from workers.sandbox import SandboxImage
from workers.verifiers import Item
from workers.verifiers.answers import references_unfilled

from .swe_bench import SWE_BENCH, read_swe_bench_upload, verifier_timeout
from .task_files import ColumnMapping, read_tasks

log = logging.getLogger(__name__)

ID_RE = re.compile(r"[0-9a-f]{32}")
KEY_RE = re.compile(r"[0-9a-f]{20}")
PREVIEW_ROWS = 5
STALE_SECONDS = 120
KEEP_SECONDS = 2 * 24 * 3600  # an upload nobody published is removed after this
SUFFIXES = (".jsonl.gz", ".ndjson.gz", ".json.gz", ".csv.gz", ".tsv.gz", ".jsonl", ".ndjson", ".json", ".csv", ".tsv",
            ".parquet", ".pq", ".gz")

_running: set[tuple[str, str]] = set()
_lock = threading.Lock()


READ_TASK_UPLOAD = "workers.tasks.read_task_upload"
UPLOAD_QUEUE = "studio"


def background_bytes() -> int:
    return settings.TASK_UPLOAD_BACKGROUND_BYTES


def max_bytes() -> int:
    return settings.TASK_UPLOAD_MAX_BYTES


def uploads_root() -> Path:
    return Path(settings.DATA_DIR) / "uploads" / "tasks"


def _write_json(path: Path, data) -> None:
    """Whole or not at all: a reader polling the file never sees half of it."""
    partial = path.with_name(f".{path.name}.{threading.get_ident()}.partial")
    partial.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    os.replace(partial, path)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@dataclass
class Upload:
    id: str
    directory: Path

    @classmethod
    def new(cls) -> Upload:
        sweep()
        upload_id = uuid.uuid4().hex
        directory = uploads_root() / upload_id
        directory.mkdir(parents=True)
        return cls(upload_id, directory)

    @classmethod
    def find(cls, upload_id: str) -> Upload | None:
        if not ID_RE.fullmatch(upload_id or ""):
            return None
        directory = uploads_root() / upload_id
        return cls(upload_id, directory) if (directory / "meta.json").is_file() else None

    @property
    def meta(self) -> dict:
        return _read_json(self.directory / "meta.json") or {}

    def stored_name(self, name: str) -> str:
        """Where the file goes: `source` with the suffix of the name it was sent with (which says its type)."""
        lowered = name.lower()
        return "source" + next((suffix for suffix in SUFFIXES if lowered.endswith(suffix)), "")

    @property
    def source(self) -> Path:
        return self.directory / self.meta["stored"]

    def describe(self, *, project: str, kind: str, slug: str, user_id: int, name: str, stored: str, size: int,
                 fmt: str) -> None:
        _write_json(self.directory / "meta.json", {
            "project": project, "kind": kind, "slug": slug, "user": user_id, "name": name, "stored": stored,
            "size": size, "format": fmt, "created": time.time()})

    def belongs_to(self, *, project: str, kind: str, slug: str, user_id: int) -> bool:
        meta = self.meta
        return (meta.get("project"), meta.get("kind"), meta.get("slug"), meta.get("user")) == (
            project, kind, slug, user_id)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def job_dir(self, key: str) -> Path:
        return self.directory / "jobs" / key


def sweep(now: float | None = None) -> None:
    """Remove the uploads older than KEEP_SECONDS (never published, or left mid-way)."""
    root, now = uploads_root(), now or time.time()
    if not root.is_dir():
        return
    for directory in root.iterdir():
        try:
            if now - directory.stat().st_mtime > KEEP_SECONDS:
                shutil.rmtree(directory, ignore_errors=True)
        except OSError:
            continue


# --- rendering: the conversation the engine prompts the model with -------------------------------------------

def placeholders_in_order(prompt_template: str) -> list[str]:
    """The prompt template's input names, in the order they first appear."""
    names = []
    for _, name, _, _ in string.Formatter().parse(prompt_template):
        if name and name not in names:
            names.append(name)
    return names


def engine_template(spec: dict) -> TaskTemplate:
    """The spec's prompt as the engine holds it (workers/rl/types.py: TaskTemplate.messages renders it); the rest
    (image, verifier, limits) takes no part in rendering."""
    return TaskTemplate(key="", domain="", system_prompt=spec.get("system_prompt", ""),
                        prompt_template=spec["prompt_template"], tools=(), limits=Limits(), image=None,
                        verifier_key="", verifier_spec=None, examples=tuple(spec.get("examples", ())))


def render(template: TaskTemplate, instance: dict) -> list[dict]:
    """The conversation a task instance opens with, as a trajectory records it (without the few-shot examples)."""
    item = Item(key=instance["key"], inputs=instance["inputs"], hidden=instance.get("hidden", {}))
    return template.messages(item, examples=False)


def render_problem(template: TaskTemplate, instance: dict, verifier_spec: VerifierSpec | None = None) -> str | None:
    """Why the prompt template cannot render this instance, or its verifier cannot read what it needs from the
    instance's hidden fields (a reference it fills in), or None."""
    try:
        render(template, instance)
    except KeyError as exc:
        return f"no input {exc.args[0]!r}, which the prompt template uses"
    except (ValueError, TypeError, IndexError, AttributeError) as exc:
        return f"the prompt template cannot render it: {exc}"
    if verifier_spec:
        item = Item(key=instance["key"], inputs=instance["inputs"], hidden=instance.get("hidden", {}))
        problem = references_unfilled(verifier_spec, item)
        if problem:
            return f"the verifier cannot grade it: {problem}"
    return None


# --- jobs -------------------------------------------------------------------------------------------------------

def job_key(*, fmt: str, mapping: ColumnMapping | None, head: int, verifier: str = "") -> str:
    identity = json.dumps({"format": fmt, "mapping": mapping.to_json() if mapping else None, "head": head,
                           "verifier": verifier}, sort_keys=True)
    return hashlib.sha256(identity.encode()).hexdigest()[:20]


def job_state(upload: Upload, key: str) -> dict | None:
    if not KEY_RE.fullmatch(key or ""):
        return None
    return _read_json(upload.job_dir(key) / "state.json")


def job_instances(upload: Upload, key: str) -> list[dict]:
    with open(upload.job_dir(key) / "instances.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


@dataclass(frozen=True)
class Replacement:
    """What publishing a job's tasks does to the head version's: the new version holds exactly the file's tasks,
    so every one of the head's is replaced — kept as it is, changed (same key, other content) or removed — and
    the file's other keys are new."""

    replaced: int
    kept: int
    changed: int
    removed: int
    new: int


def job_replacement(upload: Upload, key: str, *, head_hashes: dict[str, str]) -> Replacement | None:
    """The job's tasks against the head's (`head_hashes`: content hash by key, as the registry stores them);
    None where the job stored no tasks."""
    hashes = _read_json(upload.job_dir(key) / "hashes.json")
    if hashes is None:
        return None
    kept = sum(head_hashes.get(task) == digest for task, digest in hashes.items())
    changed = sum(task in head_hashes for task in hashes) - kept
    return Replacement(replaced=len(head_hashes), kept=kept, changed=changed,
                       removed=len(head_hashes) - kept - changed, new=len(hashes) - kept - changed)


def _stale(state: dict | None) -> bool:
    return state is not None and state.get("state") == "running" and time.time() - state.get("updated", 0) > \
        STALE_SECONDS


def job_stalled(upload: Upload, key: str, state: dict | None) -> bool:
    """Running by its state, yet neither updated for STALE_SECONDS nor running in this process."""
    with _lock:
        here = (upload.id, key) in _running
    return not here and _stale(state)


def job_ensure(upload: Upload, *, fmt: str, mapping: ColumnMapping | None, head: int, spec: dict,
               verifier: tuple[str, dict] | None = None, image: dict | None = None) -> tuple[str, dict]:
    """The job reading `upload` this way: (key, state). Runs it now for a small file; starts it in a background
    thread for a large one (state: running), unless it is done or running already. `verifier`: (ref, spec) of
    the verifier the template names, whose references every row's hidden fields must fill. `image`: the
    template's sandbox image (SandboxImage.to_json), where a swe-bench upload's instances are validated; such a
    job always runs in the background, whatever its size."""
    key = job_key(fmt=fmt, mapping=mapping, head=head, verifier=verifier[0] if verifier else "")
    state = job_state(upload, key)
    if state is not None and not job_stalled(upload, key, state):
        return key, state
    directory = upload.job_dir(key)
    directory.mkdir(parents=True, exist_ok=True)
    _write_json(directory / "params.json", {"format": fmt, "mapping": mapping.to_json() if mapping else None,
                                            "head": head, "spec": spec,
                                            "verifier_spec": verifier[1] if verifier else None, "image": image})
    size = upload.meta.get("size", 0)
    _write_json(directory / "state.json", {"state": "running", "rows": 0, "done": 0, "total": size,
                                           "updated": time.time()})
    if size <= background_bytes() and fmt != SWE_BENCH:
        job_run(upload.id, key)
    elif not settings.EMBEDDED:
        from apps.common.wiring import celery_app  # the studio's Celery app is the composition root's

        celery_app().send_task(READ_TASK_UPLOAD, (upload.id, key), queue=UPLOAD_QUEUE)
    else:
        with _lock:
            if (upload.id, key) in _running:
                return key, job_state(upload, key)
            _running.add((upload.id, key))
        threading.Thread(target=_in_background, args=(upload.id, key), name=f"task-upload-{upload.id[:8]}",
                         daemon=True).start()
    return key, job_state(upload, key)


def _in_background(upload_id: str, key: str) -> None:
    try:
        job_run(upload_id, key)
    finally:
        with _lock:
            _running.discard((upload_id, key))


def job_run(upload_id: str, key: str) -> None:
    """Read the upload as the job's params say; its state says how far it got, then what it found."""
    upload = Upload.find(upload_id)
    if upload is None:
        return
    directory = upload.job_dir(key)
    state_file = directory / "state.json"
    try:
        params = _read_json(directory / "params.json")
        template = engine_template(params["spec"])
        verifier_spec = parse_spec("verifier", params["verifier_spec"]) if params.get("verifier_spec") else None
        mapping = ColumnMapping.from_json(params["mapping"]) if params["mapping"] else None

        def progress(rows: int, done: int, total: int) -> None:
            _write_json(state_file, {"state": "running", "rows": rows, "done": done, "total": total,
                                     "updated": time.time()})

        if params["format"] == SWE_BENCH:  # an archive of instances and their repositories, each validated
            found = read_swe_bench_upload(upload.source, directory / "unpacked",
                                          image=SandboxImage.from_json(params["image"]),
                                          timeout=verifier_timeout(params.get("verifier_spec") or {}),
                                          progress=progress)
        else:
            found = read_tasks(upload.source, params["format"], mapping=mapping, name=upload.meta.get("name"),
                               check=lambda instance: render_problem(template, instance, verifier_spec),
                               progress=progress)
        # The good rows of a file read to its end can be published, with its bad rows left out if the uploader
        # asks; a file that broke off partway cannot: the rows after the break are unknown.
        skippable = found.read_whole and bool(found.instances) and bool(found.errors)
        if found.ok or skippable:
            partial = directory / ".instances.jsonl.partial"
            with open(partial, "w", encoding="utf-8") as handle:
                for instance in found.instances:
                    handle.write(json.dumps(instance, ensure_ascii=False) + "\n")
            os.replace(partial, directory / "instances.jsonl")
            _write_json(directory / "hashes.json", {
                instance["key"]: instance_hash(instance["key"], instance["inputs"], instance.get("hidden", {}))
                for instance in found.instances})
        preview = [{"where": where, **instance, "messages": render(template, instance)}
                   for where, instance in zip(found.places[:PREVIEW_ROWS], found.instances[:PREVIEW_ROWS],
                                              strict=True)]
        _write_json(state_file, {
            "state": "done", "format": params["format"], "mapping": params["mapping"], "head": params["head"],
            "file_type": found.file_type, "columns": found.columns, "rows": found.rows,
            "count": len(found.instances) if found.ok else 0, "good_rows": len(found.instances),
            "errors": [[e.field, e.problem] for e in found.all_errors()], "bad_rows": found.bad_rows,
            "skippable": skippable,
            "preview": preview, "updated": time.time()})
    except Exception as exc:  # the page says so; the thread must not die silently
        log.exception("reading task upload %s (job %s) failed", upload_id, key)
        _write_json(state_file, {"state": "failed", "problem": f"{type(exc).__name__}: {exc}",
                                 "updated": time.time()})


def guess_mapping(columns: list[str], placeholders: list[str]) -> ColumnMapping | None:
    """The mapping a file's column names suggest: the key from a column called key or id, each input from the
    column of its name, every other column hidden; None where some input has no column of its name."""
    lowered = {column.lower(): column for column in columns}
    key = next((lowered[name] for name in ("key", "id", "task_id", "uid", "name") if name in lowered), None)
    inputs = {name: lowered.get(name.lower()) for name in placeholders}
    if key is None or None in inputs.values():
        return None
    used = {key, *inputs.values()}
    return ColumnMapping(key=key, inputs=inputs, hidden=tuple(c for c in columns if c not in used))

