from django.apps import AppConfig


class TaskImportConfig(AppConfig):
    """Tasks brought in from outside: task files uploaded in the browser or imported with `import_tasks`, in the
    shapes benchmarks ship in (task_files.py), SWE-bench's repository tasks validated in the sandbox
    (swe_bench.py), and bug-fix tasks made from a repository (`tasks from-repo`). Each becomes a task template's
    next version through the registry's services, as any author publishes. No models of its own: an upload and
    its reading jobs are files in the data directory (upload_jobs.py)."""

    name = "apps.task_import"
    label = "task_import"
