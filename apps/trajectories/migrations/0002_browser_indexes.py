"""Indexes for the trajectory browser's keyset pages (apps/trajectories/selectors.py): each starts with the
filter most pages use (project, run, status, task) and ends with the sort key and id in the direction the
page walks them, so a page is one short index range at any depth. Measured by `manage.py bench ui`.

Plain SQL (the same on PostgreSQL and SQLite) rather than Meta.indexes, because the model belongs to the
archive; moving them into Trajectory.Meta later is a state-only change.
"""

from django.db import migrations

INDEXES = {
    "trajectory_run_recent": "(run_id, finished_at DESC, id)",
    "trajectory_project_status": "(project_id, status, finished_at DESC, id)",
    "trajectory_project_reward": "(project_id, reward, id)",
    "trajectory_run_reward": "(run_id, reward, id)",
    "trajectory_project_duration": "(project_id, duration_s, id)",
    "trajectory_project_task": "(project_id, task_key, finished_at DESC, id)",
}


class Migration(migrations.Migration):
    dependencies = [("trajectories", "0001_initial")]

    operations = [
        migrations.RunSQL(f"CREATE INDEX IF NOT EXISTS {name} ON trajectories_trajectory {columns}",
                          f"DROP INDEX IF EXISTS {name}")
        for name, columns in INDEXES.items()
    ]
