"""The database itself refuses to update a version row, whatever code (or a psql session) tries."""

from django.db import migrations

POSTGRES_UP = """
CREATE OR REPLACE FUNCTION registry_version_refuse_update() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'registry_version rows are immutable: publish a new version instead'
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER registry_version_immutable BEFORE UPDATE ON registry_version
    FOR EACH ROW EXECUTE FUNCTION registry_version_refuse_update();
"""
POSTGRES_DOWN = """
DROP TRIGGER IF EXISTS registry_version_immutable ON registry_version;
DROP FUNCTION IF EXISTS registry_version_refuse_update();
"""
SQLITE_UP = """
CREATE TRIGGER registry_version_immutable BEFORE UPDATE ON registry_version
BEGIN SELECT RAISE(ABORT, 'registry_version rows are immutable: publish a new version instead'); END;
"""
SQLITE_DOWN = "DROP TRIGGER IF EXISTS registry_version_immutable;"


def up(apps, schema_editor):
    sql = {"postgresql": POSTGRES_UP, "sqlite": SQLITE_UP}.get(schema_editor.connection.vendor)
    if sql is None:
        raise RuntimeError(f"No immutability trigger for {schema_editor.connection.vendor}; add one here.")
    schema_editor.execute(sql)


def down(apps, schema_editor):
    schema_editor.execute({"postgresql": POSTGRES_DOWN, "sqlite": SQLITE_DOWN}[schema_editor.connection.vendor])


class Migration(migrations.Migration):
    dependencies = [("registry", "0001_initial")]
    operations = [migrations.RunPython(up, down)]
