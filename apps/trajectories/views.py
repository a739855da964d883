"""Trajectory pages: the browser (filters, sorts, keyset pages), the replay, two side by side, and artifacts.

Each view finds the project for the user first (404 for non-members) and the trajectory inside that project.
"""

from __future__ import annotations

from django.http import FileResponse, Http404
from django.shortcuts import render

from apps.accounts.selectors import project_for_user
from apps.common.errors import StudioError
from apps.registry.categories import project_categories

from . import selectors
from .artifacts import artifact_open
from .replay import trajectory_info

STATUSES = ("ok", "policy_error", "timeout", "infra_error", "abandoned")  # abandoned: an episode's client left
VERDICTS = ("pass", "partial", "fail", "infra_error")


def trajectory_list(request, project):
    project = project_for_user(user=request.user, slug=project)
    filters = {name: request.GET.get(name, "").strip() for name in selectors.FILTERS}
    try:
        page = selectors.trajectory_page(project=project, filters=filters, sort=request.GET.get("sort", "recent"),
                                         after=request.GET.get("after", ""))
    except StudioError as exc:  # a filter that names nothing (at its field), a damaged page link (at `after`)
        return render(request, "trajectories/trajectory_list.html",
                      {"project": project, "error": str(exc), "error_field": exc.field, "filters": filters,
                       "categories": project_categories(project)},
                      status=exc.status)
    query = request.GET.copy()
    query.pop("after", None)
    context = {"project": project, "page": page, "filters": filters, "sorts": selectors.SORTS,
               "statuses": STATUSES, "verdicts": VERDICTS, "runs": selectors.run_choices(project=project),
               "categories": project_categories(project),
               "base_query": query.urlencode(), "first_page": not request.GET.get("after")}
    template = ("trajectories/_trajectory_rows.html" if request.headers.get("HX-Request") == "true"
                else "trajectories/trajectory_list.html")
    return render(request, template, context)


def trajectory_detail(request, project, trajectory_id):
    project = project_for_user(user=request.user, slug=project)
    row = selectors.trajectory_get(project=project, trajectory_id=trajectory_id)
    previous, following = selectors.trajectory_neighbours(trajectory=row)
    context = {"project": project, "info": trajectory_info(row), "previous": previous, "next": following,
               "same_task": selectors.trajectory_same_task(trajectory=row)}
    return render(request, "trajectories/trajectory_detail.html", context)


def trajectory_compare(request, project, trajectory_id, other_id):
    project = project_for_user(user=request.user, slug=project)
    left = selectors.trajectory_get(project=project, trajectory_id=trajectory_id)
    right = selectors.trajectory_get(project=project, trajectory_id=other_id)
    context = {"project": project, "left": trajectory_info(left), "right": trajectory_info(right)}
    return render(request, "trajectories/trajectory_compare.html", context)


def artifact(request, project, trajectory_id, name):
    project = project_for_user(user=request.user, slug=project)
    row = selectors.trajectory_get(project=project, trajectory_id=trajectory_id)
    entry = next((a for a in row.artifacts or [] if a.get("name") == name), None)
    if entry is None:
        raise Http404(f"No artifact {name!r} on this trajectory.")
    try:
        handle = artifact_open(key=entry["key"])
    except FileNotFoundError:
        raise Http404(f"The artifact {name!r} is listed but its file is gone from the artifact store.") from None
    response = FileResponse(handle, content_type=entry.get("content_type") or "application/octet-stream")
    response["Cache-Control"] = "private, max-age=3600"
    response["X-Content-Type-Options"] = "nosniff"
    if not response["Content-Type"].startswith("image/"):
        response["Content-Disposition"] = f'attachment; filename="{name.rsplit("/", 1)[-1]}"'
    return response
