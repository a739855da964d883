"""Registry pages. Each view finds the project for the user first (404 for non-members, 403 below the role the
page needs), then calls one selector or service; the templates do the rest."""

from django.contrib import messages
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.accounts.models import Role
from apps.accounts.selectors import project_for_page

from . import selectors
from .closure import dependents
from .diff import spec_diff
from .errors import PublishConflict, SpecError, VersionNotFound
from .files import YamlError, dump_yaml, field_lines, load_yaml
from .forms import AliasMoveForm, DefinitionCreateForm, VersionEditForm, VersionPairForm
from .models import Kind
from .refs import Ref, parse_ref
from .services import alias_move, spec_check, version_publish
from .skeletons import SKELETONS
from .text_diff import side_by_side

INSTANCES_PER_PAGE = 50


def _definition(project, kind, slug):
    try:
        return selectors.definition_get(project=project, kind=kind, slug=slug)
    except VersionNotFound as exc:
        raise Http404(str(exc)) from None


def _version(project, kind, slug, number):
    try:
        return selectors.version_resolve(project=project, ref=Ref(kind, slug, str(number)))
    except VersionNotFound as exc:
        raise Http404(str(exc)) from None


def _spec_editor(form, project, **attrs) -> None:
    """Make the form's spec field the schema-aware editor (static/src/spec-editor, templates/registry/
    _spec_editor.html): its schema comes from the API, its inline errors from spec_validate."""
    form.fields["spec"].widget.attrs.update({
        "data-spec-editor": "", "data-schema-url": reverse("api-v1:spec_schema", kwargs={"kind": "KIND"}),
        "data-validate-url": reverse("registry:spec_validate", kwargs={"project": project.slug}),
        "data-status-id": "spec-status", **{f"data-{name.replace('_', '-')}": value for name, value in attrs.items()}})


def _definition_slugs(project) -> dict[str, list[str]]:
    """The project's definitions by kind, for the editor's completion of references (verifier: SLUG ...)."""
    slugs: dict[str, list[str]] = {}
    for kind, slug in selectors.definition_list(project=project).order_by("kind", "slug").values_list("kind", "slug"):
        slugs.setdefault(kind, []).append(slug)
    return slugs


def _is_htmx(request) -> bool:
    return request.headers.get("HX-Request") == "true"


def definition_list(request, project):
    project, can_edit = project_for_page(user=request.user, slug=project)
    kind = request.GET.get("kind") if request.GET.get("kind") in Kind.values else None
    definitions = list(selectors.definition_list(project=project, kind=kind).order_by("kind", "slug"))
    # Grouped in the product's order of kinds, not alphabetically.
    groups = [(label, [d for d in definitions if d.kind == value]) for value, label in Kind.choices]
    context = {"project": project, "can_edit": can_edit, "kinds": Kind.choices, "kind": kind,
               "groups": [(label, rows) for label, rows in groups if rows]}
    template = "registry/_definition_groups.html" if _is_htmx(request) else "registry/definition_list.html"
    return render(request, template, context)


def _definition_page(request, project, definition, can_edit, alias_form=None, alias_errors=(), status=200):
    versions = list(selectors.version_list(definition=definition))
    context = {
        "project": project, "can_edit": can_edit, "definition": definition, "versions": versions,
        "aliases": selectors.alias_list(definition=definition),
        # Comparing the newest version with its parent is what a reader wants most often.
        "diff_a": versions[1].number if len(versions) > 1 else (versions[0].number if versions else 1),
        "diff_b": versions[0].number if versions else 1,
        "alias_form": alias_form or AliasMoveForm(initial={"number": versions[0].number if versions else 1}),
        "alias_errors": alias_errors,
    }
    return render(request, "registry/definition_detail.html", context, status=status)


def definition_detail(request, project, kind, slug):
    project, can_edit = project_for_page(user=request.user, slug=project)
    return _definition_page(request, project, _definition(project, kind, slug), can_edit)


def version_detail(request, project, kind, slug, number):
    project, can_edit = project_for_page(user=request.user, slug=project)
    version = _version(project, kind, slug, number)
    after = request.GET.get("after", "")
    # One extra row says whether a next page exists without counting the whole set.
    page = selectors.instance_page(version=version, after_key=after, limit=INSTANCES_PER_PAGE + 1)
    context = {
        "project": project, "can_edit": can_edit, "definition": version.definition, "version": version,
        "aliases": selectors.alias_list(definition=version.definition).filter(version=version),
        "instances": page[:INSTANCES_PER_PAGE], "after": after,
        "next_after": page[INSTANCES_PER_PAGE - 1].key if len(page) > INSTANCES_PER_PAGE else None,
    }
    return render(request, "registry/version_detail.html", context)


def version_diff(request, project, kind, slug):
    project, can_edit = project_for_page(user=request.user, slug=project)
    definition = _definition(project, kind, slug)
    template = "registry/_diff.html" if _is_htmx(request) else "registry/diff.html"
    context = {"project": project, "can_edit": can_edit, "definition": definition}
    pair = VersionPairForm(request.GET)
    if not pair.is_valid():
        context["error"] = "Pick two versions to compare: a and b must be version numbers, e.g. ?a=1&b=2."
        return render(request, template, context, status=400)
    try:
        old, new = (selectors.version_resolve(project=project, ref=Ref(kind, slug, str(pair.cleaned_data[side])))
                    for side in ("a", "b"))
    except VersionNotFound as exc:
        context["error"] = str(exc)
        return render(request, template, context, status=404)
    context.update(old=old, new=new, changes=spec_diff(old.spec, new.spec),
                   rows=side_by_side(dump_yaml(old.spec), dump_yaml(new.spec)))
    return render(request, template, context)


def version_edit(request, project, kind, slug):
    project, can_edit = project_for_page(user=request.user, slug=project, min_role=Role.EDITOR)
    definition = _definition(project, kind, slug)
    head = selectors.version_head(definition=definition)
    context = {"project": project, "can_edit": can_edit, "definition": definition, "head": head,
               "spec_definitions": _definition_slugs(project)}
    if request.method != "POST":
        context["form"] = VersionEditForm(initial={"spec": dump_yaml(head.spec), "expected_head": head.number})
        _spec_editor(context["form"], project, kind=kind, slug=slug)
        return render(request, "registry/version_edit.html", context)
    form = context["form"] = VersionEditForm(request.POST)
    _spec_editor(form, project, kind=kind, slug=slug)
    if not form.is_valid():
        return render(request, "registry/version_edit.html", context, status=400)
    if request.POST.get("action") != "publish":
        return _publish_review(request, context, project, definition, head, form.cleaned_data["spec"])
    try:
        published = version_publish(project=project, kind=kind, slug=slug, spec=form.cleaned_data["spec"],
                                    author=request.user, message=form.cleaned_data["message"],
                                    expected_head=form.cleaned_data["expected_head"], via="web")
    except SpecError as exc:
        context["spec_errors"] = exc.errors
        return render(request, "registry/version_edit.html", context, status=400)
    except PublishConflict as exc:
        context.update(conflict=str(exc), started_from=form.cleaned_data["expected_head"])
        return render(request, "registry/version_edit.html", context, status=409)
    if not published.created:
        context["unchanged"] = published.version
        return render(request, "registry/version_edit.html", context)
    messages.success(request, f"Published {published.version.ref}.")
    return redirect(_version_url(project, published.version))


def _publish_review(request, context, project, definition, head, spec):
    """The step between editing and publishing: what the new version changes against the head, field by field
    and line by line, and what else it changes (definitions that refer to it without a number); or the spec's
    problems, at their lines, before anything is published."""
    kind, slug = definition.kind, definition.slug
    try:
        stored = spec_check(project=project, kind=kind, slug=slug, spec=spec)
    except SpecError as exc:
        context["spec_errors"] = exc.errors
        return render(request, "registry/version_edit.html", context, status=400)
    context.update(review=True, changes=spec_diff(head.spec, stored), old=head,
                   rows=side_by_side(dump_yaml(head.spec), dump_yaml(stored)),
                   effects=dependents(project=project, kind=kind, slug=slug))
    return render(request, "registry/version_edit.html", context)


def _start_from(project, choice: str) -> tuple[str, str] | None:
    """(kind, spec text) for the "start from" menu: `skeleton:KIND`, or `KIND/SLUG@N` to copy a version."""
    if choice.startswith("skeleton:") and choice.removeprefix("skeleton:") in SKELETONS:
        kind = choice.removeprefix("skeleton:")
        return kind, SKELETONS[kind]
    try:
        version = selectors.version_resolve(project=project, ref=parse_ref(choice))
    except VersionNotFound:
        return None
    spec = dict(version.spec)
    spec.pop("resolved", None)  # a copied bundle resolves its own members on publish
    return version.definition.kind, dump_yaml(spec)


def definition_create(request, project):
    project, can_edit = project_for_page(user=request.user, slug=project, min_role=Role.EDITOR)
    initial = {}
    if request.method != "POST" and (start := _start_from(project, request.GET.get("from", ""))):
        initial = {"kind": start[0], "spec": start[1]}
    form = DefinitionCreateForm(request.POST if request.method == "POST" else None,
                                initial={**initial, "kind": request.GET.get("kind") or initial.get("kind")})
    _spec_editor(form, project, kind_field="id_kind", slug_field="id_slug")
    context = {"project": project, "can_edit": can_edit, "form": form, "skeletons": list(SKELETONS),
               "spec_definitions": _definition_slugs(project),
               "copyable": [f"{d.kind}/{d.slug}@{d.head_number}" for d in selectors.definition_list(
                   project=project).exclude(head_number=None).order_by("kind", "slug")],
               "start_from": request.GET.get("from", "")}
    if not form.is_valid():
        return render(request, "registry/definition_create.html", context, status=400 if form.is_bound else 200)
    data = form.cleaned_data
    try:
        # expected_head=0: this page only starts new definitions; an existing one is edited on its own page.
        published = version_publish(project=project, kind=data["kind"], slug=data["slug"], spec=data["spec"],
                                    author=request.user, message=data["message"],
                                    description=data["description"], expected_head=0, via="web")
    except SpecError as exc:
        context["spec_errors"] = exc.errors
        return render(request, "registry/definition_create.html", context, status=400)
    except PublishConflict:
        context["exists"] = reverse("registry:definition_detail",
                                    kwargs={"project": project.slug, "kind": data["kind"], "slug": data["slug"]})
        return render(request, "registry/definition_create.html", context, status=409)
    messages.success(request, f"Published {published.version.ref}.")
    return redirect(_version_url(project, published.version))


@require_POST
def spec_validate(request, project):
    """The editor's inline validation: the YAML as typed, checked as publishing it as kind/slug would check it
    (the API's `validate` gives the same errors), each error with the line of the field it concerns."""
    project, _ = project_for_page(user=request.user, slug=project, min_role=Role.EDITOR)
    kind, slug, text = request.POST.get("kind", ""), request.POST.get("slug", ""), request.POST.get("spec", "")
    if kind not in Kind.values:
        return JsonResponse({"errors": [{"field": "kind", "problem": f"choose one of {', '.join(Kind.values)}",
                                         "line": None}]})
    try:
        spec = load_yaml(text)
    except YamlError as exc:
        return JsonResponse({"errors": [{"field": "", "problem": str(exc), "line": exc.line}]})
    if not isinstance(spec, dict):
        return JsonResponse({"errors": [{"field": "", "problem": "the spec must be a YAML mapping of fields "
                                                                 "(field: value, one per line)", "line": 1}]})
    try:
        # A slug not chosen yet is checked as a placeholder; the slug field has its own check on publish.
        spec_check(project=project, kind=kind, slug=slug or "new", spec=spec)
    except SpecError as exc:
        lines = field_lines(text, [e.field for e in exc.errors])
        return JsonResponse({"errors": [{"field": e.field, "problem": e.problem, "line": line}
                                        for e, line in zip(exc.errors, lines, strict=True)]})
    return JsonResponse({"errors": []})


@require_POST
def alias_set(request, project, kind, slug):
    project, can_edit = project_for_page(user=request.user, slug=project, min_role=Role.EDITOR)
    definition = _definition(project, kind, slug)
    form = AliasMoveForm(request.POST)
    if not form.is_valid():
        return _definition_page(request, project, definition, can_edit, alias_form=form, status=400)
    try:
        version = selectors.version_resolve(project=project, ref=Ref(kind, slug, str(form.cleaned_data["number"])))
        alias_move(version=version, name=form.cleaned_data["name"], actor=request.user, via="web")
    except VersionNotFound as exc:
        return _definition_page(request, project, definition, can_edit, alias_form=form,
                                alias_errors=[str(exc)], status=400)
    except SpecError as exc:
        return _definition_page(request, project, definition, can_edit, alias_form=form,
                                alias_errors=[str(e) for e in exc.errors], status=400)
    messages.success(request, f"{form.cleaned_data['name']} now points to {version.ref}.")
    return redirect("registry:definition_detail", project=project.slug, kind=kind, slug=slug)


def _version_url(project, version) -> str:
    definition = version.definition
    return reverse("registry:version_detail", kwargs={"project": project.slug, "kind": definition.kind,
                                                      "slug": definition.slug, "number": version.number})
