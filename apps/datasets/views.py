"""Dataset pages: the project's datasets, the build form (editors), and a version — what it pins, what was left
out, its rows a page at a time with their provenance, and its JSONL to download."""

from __future__ import annotations

from django.contrib import messages
from django.http import FileResponse, Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.accounts.models import Role
from apps.accounts.selectors import project_for_page, project_for_user
from apps.registry.dataset_store import DatasetUnavailable, dataset_file

from . import selectors
from .errors import DatasetError
from .forms import DatasetBuildForm
from .services import dataset_build, dataset_upload


def dataset_list(request, project):
    project, can_edit = project_for_page(user=request.user, slug=project)
    return render(request, "datasets/dataset_list.html", {
        "project": project, "can_edit": can_edit, "datasets": selectors.dataset_list(project=project)})


def dataset_new(request, project):
    """Build a dataset (editors): its first version, or the next one of an existing slug."""
    project = project_for_user(user=request.user, slug=project, min_role=Role.EDITOR)
    if request.method == "POST":
        form = DatasetBuildForm(request.POST, request.FILES, project=project)
    else:
        initial = {name: value for name, value in request.GET.items() if name in DatasetBuildForm.base_fields}
        form = DatasetBuildForm(initial=initial, project=project)
    if form.is_bound and form.is_valid():
        data, sources = form.cleaned_data, form.sources()
        try:
            if data["upload"] is not None:
                upload = dataset_upload(project=project, name=data["upload"].name, content=data["upload"].read(),
                                        fmt=data["format"], actor=request.user)
                sources.append(upload.source())
            if not sources:
                raise DatasetError("tick at least one source, or upload a file", field="use_trajectories")
            built = dataset_build(project=project, slug=data["slug"], fmt=data["format"], sources=sources,
                                  exclude_eval_tasks=data["exclude_eval_tasks"], message=data["message"],
                                  description=data["description"] or None, actor=request.user)
        except DatasetError as exc:
            for problem in exc.errors or [None]:
                place = form.place(problem.field, sources) if problem else None
                form.add_error(place, problem.problem if problem and place else str(problem or exc))
        else:
            version = built.version
            messages.success(request, f"{version.ref}: {version.spec['rows']:,} rows" +
                             ("" if built.created else " — the same rows as before, so no new version"))
            return redirect("datasets:version", project=project.slug, slug=version.definition.slug,
                            number=version.number)
    return render(request, "datasets/dataset_new.html", {"project": project, "form": form},
                  status=400 if form.is_bound else 200)


def dataset_version(request, project, slug, number):
    project, can_edit = project_for_page(user=request.user, slug=project)
    version = selectors.dataset_version_get(project=project, slug=slug, number=number)
    try:
        start = int(request.GET.get("start", "1"))
    except ValueError:
        start = 1
    try:
        page, unavailable = selectors.dataset_rows_page(version=version, start=start), ""
    except DatasetUnavailable as exc:
        page, unavailable = None, str(exc)
    return render(request, "datasets/version_detail.html", {
        "project": project, "can_edit": can_edit, "version": version, "spec": version.spec, "page": page,
        "unavailable": unavailable, "versions": selectors.dataset_versions(project=project, slug=slug)})


def dataset_download(request, project, slug, number):
    project = project_for_user(user=request.user, slug=project)
    version = selectors.dataset_version_get(project=project, slug=slug, number=number)
    try:
        path = dataset_file(version).path
    except DatasetUnavailable as exc:
        raise Http404(str(exc)) from None
    return FileResponse(path.open("rb"), as_attachment=True, filename=f"{slug}@{number}.jsonl",
                        content_type="application/x-ndjson")


@require_POST
def dataset_rebuild(request, project, slug, number):
    """Build again from the version's sources (editors): the archive may hold more by now."""
    project = project_for_user(user=request.user, slug=project, min_role=Role.EDITOR)
    version = selectors.dataset_version_get(project=project, slug=slug, number=number)
    spec = version.spec
    try:
        built = dataset_build(project=project, slug=slug, fmt=spec["format"], sources=spec["sources"],
                              exclude_eval_tasks=spec["exclude_eval_tasks"], message=f"rebuilt from @{number}",
                              actor=request.user)
    except DatasetError as exc:
        messages.error(request, str(exc))
        return redirect("datasets:version", project=project.slug, slug=slug, number=number)
    messages.success(request, f"{built.version.ref}: {built.version.spec['rows']:,} rows" +
                     ("" if built.created else " — the same rows as before, so no new version"))
    return redirect("datasets:version", project=project.slug, slug=slug, number=built.version.number)
