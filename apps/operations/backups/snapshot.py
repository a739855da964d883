"""A studio's backup, one directory:

    manifest.json      written last (a backup without it is incomplete): versions, the database's tables and their
                       rows, every object's size and sha256, the settings that matter (secrets by name only), and
                       the studio's fingerprint (each project's registry export, each run's counts)
    database.pgdump    PostgreSQL: pg_dump's custom format          | database.sqlite3  SQLite: its backup API
    blobs/KEY          the blob storage's objects (blobs.py)

`restore` brings one into an EMPTY studio (no rows but `migrate`'s own, no objects under the blob prefixes) and
checks it: every table's rows, every object, the fingerprint. The objects go first, then the database in one
transaction; if anything fails before the database is in, the objects written are removed again, so the target is
empty as before. The studio the backup came from need not be stopped: the database is one snapshot, and objects
copied after it are at least what its rows name (a checkpoint removed by retention meanwhile is left out whole).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.models import Count

from apps.accounts.models import Project
from apps.common import wiring
from apps.registry.files import export_project
from apps.review.models import Label
from apps.runs.models import Checkpoint, Run
from apps.trajectories.models import Trajectory

from . import blobs, database
from .errors import BackupError

FORMAT = 1
MANIFEST = "manifest.json"
DATABASE_FILES = {"postgresql": "database.pgdump", "sqlite": "database.sqlite3"}
# Their values are never written: a backup only says whether each was set. The operator carries them.
SECRETS = {"SECRET_KEY": "SECRET_KEY", "JUDGE_API_KEY": "JUDGE_API_KEY",
           "STUDIO_SERVE_WEIGHTS_TOKEN": "INFERENCE_SERVER_TOKEN", "STUDIO_METRICS_TOKEN": "METRICS_TOKEN",
           # The key the projects' stored endpoint keys are encrypted with: the backup holds only their ciphertext,
           # which a studio restored without the same key cannot read.
           "STUDIO_SECRETS_KEY": "SECRETS_KEY"}
# What a restored studio should run with to behave as the backed-up one did (a different DEMO_PRETRAIN_SECONDS,
# for one, makes another demo base model).
SETTINGS = ("STORAGE_URL", "STORAGE_CACHE_BYTES", "STORAGE_OUTAGE_SECONDS", "EMBEDDED", "REMOTE_ROLLOUTS",
            "SANDBOX_BACKEND", "RUN_STALE_SECONDS", "RUN_DATABASE_OUTAGE_SECONDS", "DEMO_PRETRAIN_SECONDS",
            "MODEL_DIRS", "JUDGE_BASE_URL", "JUDGE_TIMEOUT_SECONDS", "JUDGE_MAX_CONCURRENCY",
            "JUDGE_PRICE_PER_1K_INPUT_TOKENS", "JUDGE_PRICE_PER_1K_OUTPUT_TOKENS", "GPU_PRICE_PER_HOUR",
            "SANDBOX_CPU_PRICE_PER_HOUR", "ALLOWED_HOSTS", "HTTPS", "PROXIES", "TASK_UPLOAD_MAX_BYTES",
            "EGRESS_ALLOW", "SANDBOX_NETWORK", "RUN_STUCK_SECONDS", "STOP_SECONDS")

Say = Callable[[str], None]


def _without_credentials(url: str) -> str:
    """A URL without the user and password it may carry."""
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))


def settings_that_matter() -> dict:
    values = {}
    for name in SETTINGS:
        value = getattr(settings, name, None)
        if isinstance(value, str) and "://" in value:
            value = _without_credentials(value)
        values[name] = [str(v) for v in value] if isinstance(value, list) else value
    db = connection.settings_dict
    values["DATABASE"] = {"vendor": connection.vendor, "host": db.get("HOST") or "", "port": str(db.get("PORT") or ""),
                          "name": str(db.get("NAME"))}
    values["secrets_set"] = {name: bool(getattr(settings, setting, "")) for name, setting in SECRETS.items()}
    return values


def _studio_version() -> dict:
    try:
        package = version("posttrain-studio")
    except PackageNotFoundError:
        package = None
    commit = subprocess.run(["git", "-C", str(settings.BASE_DIR), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    return {"package": package, "commit": commit}


def fingerprint() -> dict:
    """What a restore must give back unchanged: each project's registry export (a digest of its files) and each
    run's status, step, trajectories, labels and checkpoints."""
    registry = {}
    for project in Project.objects.order_by("slug"):
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            digest = hashlib.sha256()
            for path in sorted(export_project(project=project, directory=root)):
                digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
        registry[project.slug] = digest.hexdigest()
    def per_run(rows) -> dict:
        return dict(rows.values_list("run").annotate(n=Count("pk")).order_by())

    trajectories = per_run(Trajectory.objects)
    checkpoints = per_run(Checkpoint.objects)
    labels = dict(Label.objects.values_list("item__trajectory__run").annotate(n=Count("pk")).order_by())
    runs = {}
    for run in Run.objects.order_by("created_at", "pk"):
        runs[str(run.pk)] = {"name": run.name, "status": run.status, "step": run.step,
                             "trajectories": trajectories.get(run.pk, 0), "labels": labels.get(run.pk, 0),
                             "checkpoints": checkpoints.get(run.pk, 0)}
    return {"registry": registry, "runs": runs}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- backup ---------------------------------------------------------------------------------------------------

def backup(*, directory: Path, say: Say, models: bool = True) -> dict:
    """Write a backup of this studio into `directory` (absent or empty); returns its manifest."""
    started = time.monotonic()
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise BackupError(f"{directory} is not empty: give a new directory for each backup")
    directory.mkdir(parents=True, exist_ok=True)
    vendor = database.vendor()
    if vendor not in DATABASE_FILES:
        raise BackupError(f"backing up a {vendor} database is not supported: PostgreSQL or SQLite")
    dump = directory / DATABASE_FILES[vendor]
    about = {"vendor": vendor, "file": dump.name}
    say(f"database: {vendor}, writing {dump}")
    if vendor == "postgresql":
        about.update(database.check_pg_dump())
        if not about["matches"]:
            say(f"database: pg_dump ({about['pg_dump']}) is newer than the server ({about['server']}); restoring "
                f"needs pg_restore {about['pg_dump_major']} or newer")
        with database.postgres_snapshot() as snapshot:
            database.pg_dump(dump, snapshot=snapshot)
            about["tables"] = database.row_counts()
            about["migrations"] = database.applied_migrations()
            studio = fingerprint()
    else:
        with database.sqlite_snapshot():
            database.sqlite_backup(dump)
            about["migrations"] = database.applied_migrations()
            studio = fingerprint()
        about["tables"] = database.sqlite_counts(dump)
    about.update(bytes=dump.stat().st_size, sha256=_sha256(dump))
    say(f"database: {sum(about['tables'].values())} rows in {len(about['tables'])} tables, "
        f"{about['bytes'] / 1e6:.1f} MB")

    storage = wiring.blob_storage()
    prefixes = blobs.PREFIXES if models else tuple(p for p in blobs.PREFIXES if p != "models")
    say(f"blobs: copying {', '.join(prefixes)} from {storage.url}")
    objects = blobs.back_up(storage, directory / "blobs", prefixes=prefixes, say=say)
    manifest = {
        "format": FORMAT,
        "created_at": datetime.now(UTC).isoformat(),
        "studio": _studio_version(),
        "database": about,
        "storage": {"url": storage.url, "local": storage.local, "prefixes": list(prefixes), "objects": len(objects),
                    "bytes": sum(entry["bytes"] for entry in objects.values())},
        "blobs": objects,
        "settings": settings_that_matter(),
        "fingerprint": studio,
        "seconds": round(time.monotonic() - started, 1),
    }
    partial = directory / f"{MANIFEST}.partial"
    partial.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    partial.rename(directory / MANIFEST)  # last: the backup is complete
    say(f"backup written to {directory}: {len(about['tables'])} tables, {len(objects)} objects "
        f"({manifest['storage']['bytes'] / 1e6:.1f} MB) in {manifest['seconds']} s")
    return manifest


# --- restore --------------------------------------------------------------------------------------------------

def read_manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise BackupError(f"{directory} holds no {MANIFEST}: it is not a backup, or its backup did not finish")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{path} is of backup format {manifest.get('format')}; this studio reads format {FORMAT}")
    return manifest


def _check_compatible(manifest: dict) -> None:
    about = manifest["database"]
    if about["vendor"] != connection.vendor:
        raise BackupError(f"this backup holds a {about['vendor']} database; this studio's DATABASE_URL is "
                          f"{connection.vendor}. Restore into a {about['vendor']} database")
    known = set(MigrationLoader(None, ignore_no_migrations=True).disk_migrations)
    unknown = [f"{app}.{name}" for app, name in about["migrations"] if (app, name) not in known]
    if unknown:
        raise BackupError(f"the backup's database has migrations this code does not know ({', '.join(unknown[:5])}): "
                          "it was made by newer code; restore with that version of the studio")


def _check_empty(manifest: dict, storage) -> None:
    rows = database.data_tables()
    if rows:
        named = ", ".join(f"{table} ({count})" for table, count in sorted(rows.items())[:6])
        raise BackupError(f"this studio is not empty: its database holds rows in {named}. A restore only goes into "
                          "an empty studio: give it a new database (createdb) and a new data directory or bucket")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            extra = set(connection.introspection.table_names(cursor)) - set(manifest["database"]["tables"])
        if extra:
            raise BackupError(f"this database has tables the backup's lacks ({', '.join(sorted(extra)[:5])}): it was "
                              "migrated by newer code than the backup's. Restore into a database without tables "
                              "(createdb), then run migrate")
    there = blobs.listing(storage, prefixes=manifest["storage"]["prefixes"])
    if there:
        raise BackupError(f"this studio is not empty: its blob storage {storage.url} holds {len(there)} objects "
                          f"(e.g. {next(iter(there))}). Restore into an empty data directory or bucket")


def _move_checkpoint_paths(old_root: str, new_root: str) -> int:
    """Checkpoint rows name their folder by the storage's root (a local path or a bucket URL): the restored ones
    name the new root."""
    if old_root == new_root:
        return 0
    moved = []
    for checkpoint in Checkpoint.objects.filter(path__startswith=old_root.rstrip("/") + "/").only("pk", "path"):
        checkpoint.path = new_root.rstrip("/") + checkpoint.path[len(old_root.rstrip("/")):]
        moved.append(checkpoint)
    Checkpoint.objects.bulk_update(moved, ["path"], batch_size=500)
    return len(moved)


def restore(*, directory: Path, say: Say) -> dict:
    """Bring the backup in `directory` into this (empty) studio and check it; returns a report."""
    started = time.monotonic()
    directory = Path(directory)
    manifest = read_manifest(directory)
    about = manifest["database"]
    _check_compatible(manifest)
    storage = wiring.blob_storage()
    _check_empty(manifest, storage)
    say(f"checking the backup ({about['vendor']}, {manifest['storage']['objects']} objects, "
        f"made {manifest['created_at']})")
    dump = directory / about["file"]
    if not dump.is_file() or _sha256(dump) != about["sha256"]:
        raise BackupError(f"{dump} is missing or is not the file that was backed up: nothing was restored")
    blobs.check_copies(directory / "blobs", manifest["blobs"], say=say)
    for name, value in settings_that_matter().items():
        was = manifest["settings"].get(name)
        if name not in ("DATABASE", "STORAGE_URL") and was is not None and was != value:
            say(f"note: {name} was {was!r} in the backed-up studio, here it is {value!r}")

    say(f"blobs: restoring into {storage.url}")
    written = blobs.restore(storage, directory / "blobs", manifest["blobs"], say=say)
    say(f"database: restoring {dump.name}")
    try:
        if about["vendor"] == "postgresql":
            database.pg_restore(dump, dumped_by_major=about["pg_dump_major"])
        else:
            database.sqlite_restore(dump)
    except BaseException:
        blobs.remove(storage, written, say=say)
        say("restore failed before the database was in: the studio is empty, as it was")
        raise

    # From here on the studio holds the backup's data: a failed check says so rather than undoing it.
    counts = database.row_counts()
    problems = [f"table {table}: {counts.get(table)} rows, the backup has {rows}"
                for table, rows in about["tables"].items() if counts.get(table) != rows]
    moved = _move_checkpoint_paths(manifest["storage"]["url"], storage.url)
    if moved:
        say(f"database: {moved} checkpoints now name their folders under {storage.url}")
    pending = _pending_migrations()
    if pending:
        say(f"database: applying {len(pending)} migrations this code has and the backup's database had not")
        call_command("migrate", interactive=False, verbosity=0)
    problems += blobs.verify(storage, manifest["blobs"], prefixes=manifest["storage"]["prefixes"])
    now = fingerprint()
    for part in ("registry", "runs"):
        for name, expected in manifest["fingerprint"][part].items():
            if now[part].get(name) != expected:
                problems.append(f"{part} {name}: {now[part].get(name)} after the restore, {expected} in the backup")
    if problems:
        raise BackupError(f"the restore finished but does not check out ({len(problems)} problems: "
                          f"{'; '.join(problems[:5])}). The studio holds the restored data as it is; to try "
                          "again, empty it (a new database, data directory or bucket) and restore again")
    report = {"tables": len(counts), "rows": sum(about["tables"].values()), "objects": len(written),
              "projects": len(now["registry"]), "runs": len(now["runs"]), "checkpoints_moved": moved,
              "seconds": round(time.monotonic() - started, 1)}
    say(f"restored and checked: {report['rows']} rows in {report['tables']} tables, {report['objects']} objects, "
        f"{report['projects']} projects' registries and {report['runs']} runs as they were, in {report['seconds']} s")
    return report


def _pending_migrations() -> list:
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    return executor.migration_plan(executor.loader.graph.leaf_nodes())
