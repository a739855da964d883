"""Reads for the dataset pages: the project's datasets with their newest version, and a page of a version's rows."""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.db.models import QuerySet
from django.http import Http404

from apps.accounts.models import Project
from apps.registry.dataset_store import dataset_file
from apps.registry.models import Definition, Version

ROWS_PER_PAGE = 25


def dataset_list(*, project: Project) -> list[tuple[Definition, Version]]:
    """(definition, newest version) of every dataset of the project, by slug."""
    definitions = Definition.objects.filter(project=project, kind="dataset").order_by("slug")
    newest = {}
    for version in (Version.objects.filter(definition__in=definitions).select_related("definition")
                    .order_by("definition_id", "-number")):
        newest.setdefault(version.definition_id, version)
    return [(definition, newest[definition.pk]) for definition in definitions if definition.pk in newest]


def dataset_versions(*, project: Project, slug: str) -> QuerySet[Version]:
    return (Version.objects.filter(definition__project=project, definition__kind="dataset", definition__slug=slug)
            .select_related("definition", "author").order_by("-number"))


def dataset_version_get(*, project: Project, slug: str, number: int) -> Version:
    version = dataset_versions(project=project, slug=slug).filter(number=number).first()
    if version is None:
        raise Http404(f"no dataset/{slug}@{number} in project {project.slug}")
    return version


@dataclass(frozen=True)
class RowsPage:
    rows: list[tuple[int, dict]]  # (line number, row)
    start: int  # the first line's number
    next_start: int | None


def dataset_rows_page(*, version: Version, start: int = 1, limit: int = ROWS_PER_PAGE) -> RowsPage:
    """Rows `start` .. start + limit - 1 (line numbers from 1) of the version's materialised JSONL."""
    start = max(1, start)
    rows = []
    with dataset_file(version).path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if number < start:
                continue
            if len(rows) == limit:
                return RowsPage(rows=rows, start=start, next_start=number)
            rows.append((number, json.loads(line)))
    return RowsPage(rows=rows, start=start, next_start=None)
