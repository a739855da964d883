"""Writes for datasets: an upload stored by its hash, and a build that materialises a dataset's rows and publishes
them as the next version of its `dataset` definition (apps/registry), pinning their content hash.

A build reads every source in order (sources.py), drops a row that repeats an earlier one (provenance aside) and
every row that answers a task an eval suite of the project asks — by task for the archive's rows (the overlap check
review exports do, apps/evals' suite_task_ids), by the prompt's text for uploaded ones — then stores the rows as
canonical JSONL (apps/registry/dataset_store.py) and publishes the spec with their hash, count and what was left out.
The same sources over an archive that has not changed give the same bytes, so the version stays the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from apps.accounts.models import Project
from apps.accounts.services import audit_record
from apps.evals.selectors import suite_task_list
from apps.registry.dataset_store import jsonl_store, upload_key
from apps.registry.errors import SpecError
from apps.registry.services import Published, version_publish
from workers.definitions.specs import DatasetSpec, parse_spec
from workers.rl.tasks.overlap import prompt_text, task_id

from .errors import DatasetError
from .rows import WHITESPACE, prompt_of, row_key, row_line, rows_parsed
from .sources import TASK, source_rows

HASH_PLACEHOLDER = "0" * 64  # lets the sources be checked by the kind's own schema before any row is read


@dataclass(frozen=True)
class Upload:
    name: str
    sha256: str
    rows: int

    def source(self) -> dict:
        return {"type": "upload", "name": self.name, "sha256": self.sha256}


def dataset_upload(*, project: Project, name: str, content: bytes, fmt: str, actor, via: str = "web") -> Upload:
    """Check an uploaded JSONL file row by row (rows.rows_parsed) and store it by its hash; a build then names it
    as an `upload` source."""
    if fmt not in ("sft", "preference"):
        raise DatasetError(f"format {fmt!r} is not sft or preference", field="format")
    rows = rows_parsed(content, fmt=fmt)
    digest = jsonl_store(b"".join(row_line(row) for row in rows), key_of=upload_key)
    name = (name or "upload.jsonl").replace("\\", "/").rsplit("/", 1)[-1][:200] or "upload.jsonl"
    audit_record(project=project, actor=actor, action="dataset.upload", target=f"upload/{digest}", via=via,
                 details={"name": name, "rows": len(rows), "format": fmt})
    return Upload(name=name, sha256=digest, rows=len(rows))


def _sources_checked(fmt: str, sources: list, exclude_eval_tasks: bool) -> DatasetSpec:
    try:
        return parse_spec("dataset", {"format": fmt, "sources": sources, "exclude_eval_tasks": exclude_eval_tasks,
                                      "content_sha256": HASH_PLACEHOLDER, "rows": 0})
    except SpecError as exc:
        raise DatasetError(str(exc), errors=exc.errors) from None


def _suite_tasks(project: Project) -> tuple[frozenset[str], frozenset[str]]:
    """(task ids, prompt texts) of every task an eval suite of the project asks."""
    tasks = suite_task_list(project=project)
    return (frozenset(task_id(task) for task in tasks),
            frozenset(WHITESPACE.sub(" ", prompt_text(task)).strip() for task in tasks))


def dataset_rows_built(*, project: Project, spec: DatasetSpec) -> tuple[list[dict], dict[str, int]]:
    """The rows the spec's sources give now, deduplicated and without the eval suites' tasks, and how many rows
    each cause left out."""
    suite_ids, suite_prompts = _suite_tasks(project) if spec.exclude_eval_tasks else (frozenset(), frozenset())
    seen, rows, left_out = set(), [], {"duplicates": 0, "eval_tasks": 0}
    for position, source in enumerate(spec.sources):
        for row in source_rows(project, source.model_dump(mode="json"), position=position, fmt=spec.format):
            task = row.pop(TASK)
            if (task is not None and task in suite_ids) or (suite_prompts and prompt_of(row) in suite_prompts):
                left_out["eval_tasks"] += 1
                continue
            key = row_key(row)
            if key in seen:
                left_out["duplicates"] += 1
                continue
            seen.add(key)
            rows.append(row)
    return rows, left_out


def dataset_build(*, project: Project, slug: str, fmt: str, sources: list[dict], exclude_eval_tasks: bool = True,
                  description: str | None = None, message: str = "", actor, via: str = "web") -> Published:
    """Materialise the rows the sources give now and publish them as the next version of dataset/<slug> (the
    same version when they are the rows it already pins)."""
    spec = _sources_checked(fmt, sources, exclude_eval_tasks)
    rows, left_out = dataset_rows_built(project=project, spec=spec)
    if not rows:
        raise DatasetError(f"the sources give no rows ({left_out['eval_tasks']} left out as eval suites' tasks, "
                           f"{left_out['duplicates']} as duplicates): nothing to train on", field="sources")
    digest = jsonl_store(b"".join(row_line(row) for row in rows))  # content-addressed: stored once, never changed
    with transaction.atomic():
        published = version_publish(project=project, kind="dataset", slug=slug, author=actor, via=via, message=message,
                                    description=description,
                                    spec={**spec.model_dump(mode="json"), "content_sha256": digest,
                                          "rows": len(rows), "left_out": left_out})
        audit_record(project=project, actor=actor, action="dataset.build", target=published.version.ref, via=via,
                     details={"rows": len(rows), "content_sha256": digest, "left_out": left_out,
                              "new_version": published.created})
    return published
