"""The one-run pages' indexes start with the project as well as the run, as every page's query does (the selector
always filters by project).

With (run_id, ...) alone, PostgreSQL weighed two indexes that each answered half of `project_id = P AND run_id = R
ORDER BY finished_at DESC, id`: the run's index with the project as a filter, and the project's newest-first
index with the run as a filter. Their estimated costs lay within a few percent, and which won depended on how
the run ids' random order happened to correlate with the table's (a fresh table of 20,000 rows: 123 against 132).
When the project's index won, the first page of one run read every newer run's rows before its own (273 ms at a
million rows, where its deep page took 21-35 ms). An index on (project_id, run_id, ...) answers the whole
condition, so it costs a tenth of the project's at any correlation. Checked by tests/apps/operations/
test_bench_ui.py, which reads the plans `bench ui` reports.
"""

from django.db import migrations

# name -> (columns, the index it replaces, that index's columns)
INDEXES = {
    "trajectory_project_run_recent": ("(project_id, run_id, finished_at DESC, id)",
                                      "trajectory_run_recent", "(run_id, finished_at DESC, id)"),
    "trajectory_project_run_reward": ("(project_id, run_id, reward, id)",
                                      "trajectory_run_reward", "(run_id, reward, id)"),
}


class Migration(migrations.Migration):
    dependencies = [("trajectories", "0002_browser_indexes")]

    operations = [
        operation
        for name, (columns, old, old_columns) in INDEXES.items()
        for operation in (
            migrations.RunSQL(f"CREATE INDEX IF NOT EXISTS {name} ON trajectories_trajectory {columns}",
                              f"DROP INDEX IF EXISTS {name}"),
            migrations.RunSQL(f"DROP INDEX IF EXISTS {old}",
                              f"CREATE INDEX IF NOT EXISTS {old} ON trajectories_trajectory {old_columns}"),
        )
    ]
