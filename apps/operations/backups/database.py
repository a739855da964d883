"""The database's half of a backup: PostgreSQL through its own tools (`pg_dump` in the custom format, `pg_restore`
in one transaction), SQLite through its online backup API; each table's row count, read in the same snapshot as
the dump, so that a restore can check it got every row.

PostgreSQL: the dump runs in a snapshot this process exports (`pg_export_snapshot`) and holds while it counts the
rows and reads the studio's fingerprint, so the counts, the fingerprint and the dump are of one instant even while
the studio writes. The connection's password reaches pg_dump in its environment (PGPASSWORD), never on its command
line, where any user of the host would read it.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.db import connection, transaction

from .errors import BackupError

# Filled by `migrate` itself on any database, data or not: a studio holding only these rows is empty.
BOOKKEEPING_TABLES = frozenset({"django_migrations", "django_content_type", "auth_permission", "django_session"})


def vendor() -> str:
    return connection.vendor


def _quoted(table: str) -> str:
    return connection.ops.quote_name(table)


def row_counts() -> dict[str, int]:
    """Every table of the database and its rows (in the caller's transaction, so in its snapshot)."""
    with connection.cursor() as cursor:
        tables = connection.introspection.table_names(cursor)
        counts = {}
        for table in sorted(tables):
            cursor.execute(f"SELECT COUNT(*) FROM {_quoted(table)}")
            counts[table] = cursor.fetchone()[0]
    return counts


def data_tables() -> dict[str, int]:
    """The tables that hold rows other than `migrate`'s own bookkeeping, with their counts: {} for an empty
    studio (a database without tables, or migrated and never used)."""
    return {table: count for table, count in row_counts().items() if count and table not in BOOKKEEPING_TABLES}


def applied_migrations() -> list[list[str]]:
    """[app, name] of every migration the database records as applied."""
    with connection.cursor() as cursor:
        if "django_migrations" not in connection.introspection.table_names(cursor):
            return []
        cursor.execute("SELECT app, name FROM django_migrations ORDER BY app, name")
        return [list(row) for row in cursor.fetchall()]


# --- PostgreSQL -----------------------------------------------------------------------------------------------

def _libpq_environment() -> dict[str, str]:
    """The Django connection as libpq's variables, for pg_dump and pg_restore (the password among them: never an
    argument)."""
    settings = connection.settings_dict
    environment = {**os.environ, "PGDATABASE": settings["NAME"]}
    for key, variable in (("HOST", "PGHOST"), ("PORT", "PGPORT"), ("USER", "PGUSER"), ("PASSWORD", "PGPASSWORD")):
        if settings.get(key):
            environment[variable] = str(settings[key])
    for option, variable in (("sslmode", "PGSSLMODE"), ("sslrootcert", "PGSSLROOTCERT"),
                             ("sslcert", "PGSSLCERT"), ("sslkey", "PGSSLKEY")):
        if settings.get("OPTIONS", {}).get(option):
            environment[variable] = str(settings["OPTIONS"][option])
    return environment


def _tool_major(tool: str) -> tuple[int, str]:
    """(major version, version line) of a PostgreSQL client tool on PATH; BackupError if it is not there."""
    path = shutil.which(tool)
    if path is None:
        raise BackupError(f"{tool} is not on PATH: install PostgreSQL's client tools of the server's major version "
                          "(Debian: apt-get install postgresql-client-<major>) on the host that runs this command")
    line = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    found = re.search(r"(\d+)(?:\.\d+)?", line)
    if found is None:
        raise BackupError(f"could not read {tool}'s version from {line!r}")
    return int(found.group(1)), line


def server_version() -> tuple[int, str]:
    """(major, full version) of the PostgreSQL server."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        full = cursor.fetchone()[0]
    return int(full.split(".")[0]), full


def check_pg_dump() -> dict:
    """pg_dump's version against the server's: one older than the server cannot dump it (refused); a newer one
    can, and the backup then needs a pg_restore at least as new (recorded, and said)."""
    server_major, server_full = server_version()
    dump_major, dump_line = _tool_major("pg_dump")
    if dump_major < server_major:
        raise BackupError(f"pg_dump is version {dump_major} ({dump_line}) but the server is {server_full}: pg_dump "
                          f"cannot dump a newer server. Install postgresql-client-{server_major} and put its pg_dump "
                          "first on PATH")
    return {"server": server_full, "pg_dump": dump_line, "pg_dump_major": dump_major,
            "matches": dump_major == server_major}


def pg_dump(target: Path, *, snapshot: str) -> None:
    """The whole database in pg_dump's custom format (compressed; pg_restore reads it in any order), as of the
    exported `snapshot`."""
    done = subprocess.run(["pg_dump", "--format=custom", "--no-owner", "--no-privileges", f"--snapshot={snapshot}",
                           f"--file={target}"], env=_libpq_environment(), capture_output=True, text=True)
    if done.returncode != 0:
        raise BackupError(f"pg_dump failed (exit {done.returncode}): {done.stderr.strip()}")


@contextmanager
def postgres_snapshot() -> Iterator[str]:
    """A read-only, repeatable-read transaction whose snapshot is exported: pg_dump given its name dumps exactly
    what the queries of this block see."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cursor.execute("SELECT pg_export_snapshot()")
        yield cursor.fetchone()[0]


def pg_restore(source: Path, *, dumped_by_major: int) -> None:
    """Load a custom-format dump into the (checked empty) database in ONE transaction: it is all there or, if
    anything fails, nothing of it is (what `migrate` had created stays). Objects the dump holds are dropped first
    (`--clean --if-exists`): an empty database `migrate` made holds the same tables, empty."""
    restore_major, restore_line = _tool_major("pg_restore")
    if restore_major < dumped_by_major:
        raise BackupError(f"this backup was written by pg_dump {dumped_by_major}; pg_restore here is {restore_line}, "
                          "which cannot read it. Install a pg_restore of that major version or newer")
    connection.close()  # ours would hold locks on the tables pg_restore drops
    done = subprocess.run(["pg_restore", "--single-transaction", "--exit-on-error", "--no-owner", "--no-privileges",
                           "--clean", "--if-exists", f"--dbname={connection.settings_dict['NAME']}", str(source)],
                          env=_libpq_environment(), capture_output=True, text=True)
    if done.returncode != 0:
        raise BackupError(f"pg_restore failed (exit {done.returncode}) and rolled back: the database is as it was "
                          f"before. {done.stderr.strip()}")


# --- SQLite ---------------------------------------------------------------------------------------------------

@contextmanager
def sqlite_snapshot() -> Iterator[None]:
    """A read transaction for the block: what its queries and `sqlite_backup` see is one instant (writers wait for
    its end; the studio's IMMEDIATE transactions would take the write lock, under which a backup never finishes)."""
    connection.ensure_connection()
    mode = connection.transaction_mode
    connection.transaction_mode = "DEFERRED"
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM sqlite_master")  # the read lock, from here
            yield
    finally:
        connection.transaction_mode = mode


def sqlite_backup(target: Path) -> None:
    """A copy of the live database, made by SQLite's online backup API in one step into a fresh file."""
    connection.ensure_connection()
    destination = sqlite3.connect(target)
    try:
        connection.connection.backup(destination)
    finally:
        destination.close()


def sqlite_restore(source: Path) -> None:
    """Replace the (checked empty) database's content with the backup's, by the backup API in one step: other
    connections see the old database or the new one, never part of it."""
    connection.ensure_connection()
    origin = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        origin.backup(connection.connection)
    finally:
        origin.close()


def sqlite_counts(path: Path) -> dict[str, int]:
    """Each table's rows in a SQLite file (the copy a backup made)."""
    database = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [name for (name,) in database.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        return {table: database.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0] for table in tables}
    finally:
        database.close()
