"""Registry figures: storing, paging, re-publishing and exporting tens of thousands of task instances.

Runs inside a transaction that is rolled back at the end, so it can run against any database.
"""

import tempfile
import time
from pathlib import Path

from django.contrib.auth import get_user_model
from django.db import connection, transaction

from apps.accounts.services import project_create
from apps.registry.files import export_project
from apps.registry.selectors import instance_page
from apps.registry.services import version_publish


class _Rollback(Exception):
    pass


def _timed(work):
    start = time.perf_counter()
    value = work()
    return value, round((time.perf_counter() - start) * 1000, 1)


def run(*, instances: int = 20_000, **_) -> dict:
    result: dict = {"database": connection.vendor, "instances": instances}
    try:
        with transaction.atomic():
            user = get_user_model().objects.create_user("bench-registry")
            project = project_create(team_slug="bench", slug="bench-registry", name="bench", owner=user)
            version_publish(project=project, kind="sandbox_image", slug="img", author=user,
                            spec={"layers": [{"type": "base", "image": "python-3.11"}]})
            version_publish(project=project, kind="verifier", slug="ver", author=user,
                            spec={"layers": [{"name": "exact", "kind": "exact", "checks": [{"type": "numeric"}]}]})
            spec = {"prompt_template": "{a}+{b}=", "sandbox_image": "img", "verifier": "ver"}
            rows = [{"key": f"k{i:07d}", "inputs": {"a": i, "b": i % 97}, "hidden": {"answer": i + i % 97}}
                    for i in range(instances)]

            def publish(spec=spec, rows=rows):
                return version_publish(project=project, kind="task_template", slug="t", spec=spec, author=user,
                                       instances=rows).version

            first, result["publish_ms"] = _timed(publish)
            _, result["republish_identical_ms"] = _timed(publish)
            _, result["publish_spec_change_same_instances_ms"] = _timed(
                lambda: publish(spec={**spec, "system_prompt": "Be exact."}, rows=None))
            changed = rows[:-1] + [{"key": "k-new", "inputs": {"a": 1, "b": 1}, "hidden": {"answer": 2}}]
            _, result["publish_one_instance_changed_ms"] = _timed(lambda: publish(rows=changed))
            _, result["first_page_ms"] = _timed(lambda: instance_page(version=first, limit=100))
            last_key = rows[-101]["key"]
            _, result["last_page_ms"] = _timed(lambda: instance_page(version=first, after_key=last_key, limit=100))
            with tempfile.TemporaryDirectory() as directory:
                _, result["export_ms"] = _timed(lambda: export_project(project=project, directory=Path(directory)))
            result["publish_us_per_instance"] = round(result["publish_ms"] * 1000 / instances, 1)
            raise _Rollback
    except _Rollback:
        pass
    return result
