"""The playground pages: try a verifier version on a response, see a task template as the model sees it and run
its reference. Each view finds the project for the user first (404 for non-members; trying things, which runs
sandboxes, needs an editor), then one selector or service."""

import uuid

from django import forms
from django.http import Http404
from django.shortcuts import render

from apps.accounts.models import Role
from apps.accounts.selectors import project_for_page
from apps.common.forms import MultilineField
from apps.registry import selectors as registry
from apps.registry.errors import VersionNotFound
from apps.registry.refs import Ref, split_slug_ref

from . import selectors, services

KEYS_LISTED = 50


class VerifyForm(forms.Form):
    version = forms.IntegerField(min_value=1)
    compare = forms.IntegerField(min_value=1, required=False, help_text="another version, verdicts side by side")
    template = forms.CharField(max_length=140, help_text="a task template: slug or slug@N")
    key = forms.CharField(max_length=200, label="Task instance")
    response = MultilineField(widget=forms.Textarea(attrs={"rows": 8, "class": "code", "spellcheck": "false"}),
                              strip=False, label="Response")


def _definition(project, kind, slug):
    try:
        return registry.definition_get(project=project, kind=kind, slug=slug)
    except VersionNotFound as exc:
        raise Http404(str(exc)) from None


def _instance_keys(template) -> list[str]:
    return [member.key for member in registry.instance_page(version=template, limit=KEYS_LISTED)] if template else []


def verifier_playground(request, project, slug):
    project, can_edit = project_for_page(user=request.user, slug=project)
    definition = _definition(project, "verifier", slug)
    versions = list(registry.version_list(definition=definition))
    templates = selectors.templates_using(verifier=definition)
    initial = {"version": versions[0].number, "template": templates[0].definition.slug if templates else ""}
    if loaded := request.GET.get("trajectory"):
        found = selectors.trajectory_response(project=project, trajectory_id=loaded) if _is_uuid(loaded) else None
        if found:
            initial.update(template=found[0].split("/", 1)[1], key=found[1], response=found[2])
    if templates and "key" not in initial:
        keys = _instance_keys(templates[0])
        initial["key"] = keys[0] if keys else ""
    form = VerifyForm(request.POST if request.method == "POST" else None, initial=initial)
    context = {"project": project, "can_edit": can_edit, "definition": definition, "versions": versions,
               "templates": templates, "form": form, "loaded": loaded,
               "usage": selectors.verifier_usage(verifier=definition)}
    status = 200
    if request.method == "POST":
        project_for_page(user=request.user, slug=project.slug, min_role=Role.EDITOR)
        status = 400
        if form.is_valid():
            data = form.cleaned_data
            try:
                chosen = [registry.version_resolve(project=project, ref=Ref("verifier", slug, str(number)))
                          for number in [data["version"], data["compare"]] if number]
                template = registry.version_resolve(project=project, ref=Ref("task_template",
                                                                             *split_slug_ref(data["template"])))
                context["tried"] = services.response_verify(verifiers=chosen, template=template, key=data["key"],
                                                            response=data["response"])
                task = services.template_task(template, data["key"])
                context.update(template_version=template, task_messages=task.template.messages(task.item),
                               task_hidden=task.item.hidden)
                status = 200
            except VersionNotFound as exc:
                form.add_error(None, str(exc))
    chosen_template = _template_or_none(project, (form.data or form.initial).get("template", ""))
    context["keys"] = _instance_keys(chosen_template)
    return render(request, "authoring/verifier_playground.html", context, status=status)


def template_playground(request, project, slug):
    project, can_edit = project_for_page(user=request.user, slug=project)
    definition = _definition(project, "task_template", slug)
    versions = list(registry.version_list(definition=definition))
    selector = request.GET.get("version") or str(versions[0].number)
    try:
        template = registry.version_resolve(project=project, ref=Ref("task_template", slug, selector))
    except VersionNotFound as exc:
        raise Http404(str(exc)) from None
    keys = _instance_keys(template)
    key = request.POST.get("key") or request.GET.get("key") or (keys[0] if keys else "")
    context = {"project": project, "can_edit": can_edit, "definition": definition, "versions": versions,
               "template": template, "keys": keys, "key": key}
    if key:
        try:
            task = services.template_task(template, key)
        except VersionNotFound as exc:
            context["error"] = str(exc)
        else:
            verifier_ref = task.template.verifier_key  # verifier/SLUG@N
            context.update(prompt_messages=task.template.messages(task.item), tools=task.template.tools,
                           limits=task.template.limits, image=task.template.image.key, verifier=verifier_ref,
                           verifier_slug=verifier_ref.split("/", 1)[1].split("@")[0])
            if request.method == "POST":
                project_for_page(user=request.user, slug=project.slug, min_role=Role.EDITOR)
                context["reference"] = services.reference_try(template=template, key=key)
                context["reference_tried"] = True
    return render(request, "authoring/template_playground.html", context)


def _template_or_none(project, text: str):
    try:
        return registry.version_resolve(project=project, ref=Ref("task_template", *split_slug_ref(text)))
    except (VersionNotFound, ValueError):
        return None


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
