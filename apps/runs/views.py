"""Run pages: the list (and a form to start a run), one run live, compare runs; the history JSON the pages load.

Each view finds the project for the user first (404 for non-members), then one selector or service.
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.accounts.models import Role
from apps.accounts.selectors import project_for_page
from apps.registry.diff import spec_diff
from apps.registry.models import Version

from . import figures, selectors
from .dispatch import run_enqueue
from .services import RunError, run_create, run_request

COMPARE_LIMIT = 8


class RunStartForm(forms.Form):
    bundle = forms.ModelChoiceField(queryset=Version.objects.none(), empty_label=None)
    steps = forms.IntegerField(min_value=1, max_value=1_000_000, initial=100)
    name = forms.CharField(max_length=200, required=False)
    config = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3, "class": "code"}),
                             help_text='Overrides of the run config as JSON, e.g. {"group_size": 4}.')

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["bundle"].queryset = (Version.objects.filter(definition__project=project,
                                                                 definition__kind="bundle")
                                          .select_related("definition").order_by("definition__slug", "-number"))
        self.fields["bundle"].label_from_instance = lambda v: v.ref

    def clean_config(self):
        text = self.cleaned_data["config"].strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("write an object of field names and values, e.g. {\"seed\": 1}")
        return value


def run_list(request, project):
    project, can_edit = project_for_page(user=request.user, slug=project)
    form = RunStartForm(project=project)
    status = 200
    if request.method == "POST":
        project, can_edit = project_for_page(user=request.user, slug=project.slug, min_role=Role.EDITOR)
        form = RunStartForm(request.POST, project=project)
        if form.is_valid():
            data = form.cleaned_data
            try:
                run = run_create(project=project, bundle=data["bundle"], steps=data["steps"], name=data["name"],
                                 overrides=data["config"], actor=request.user, via="web")
            except RunError as exc:
                form.add_error(None, str(exc))
            else:
                run_enqueue(run)
                messages.success(request, f"Run {run.name} is queued.")
                return redirect("runs:run_detail", project=project.slug, run_id=run.pk)
        status = 400
    context = {"project": project, "can_edit": can_edit, "form": form,
               "runs": selectors.run_list(project=project, status=request.GET.get("status") or None,
                                          with_reward=True)[:200]}
    return render(request, "runs/run_list.html", context, status=status)


def run_detail(request, project, run_id):
    project, can_edit = project_for_page(user=request.user, slug=project)
    run = selectors.run_get(project=project, run_id=run_id)
    panels = figures.panels_for(selectors.metric_names(run=run))
    context = {"project": project, "can_edit": can_edit, "run": run,
               "panels": [{"key": p.key, "figure": figures.to_json(figures.panel_figure(p, names, legend=False))}
                          for p, names in panels],
               "panel_rules": figures.panel_rules(),
               "checkpoints": run.checkpoints.all()[:20]}
    return render(request, "runs/run_detail.html", context)


def _int(value, default=0) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return default


def run_history(request, project, run_id):
    """Metric points after ?after_step (downsampled on the server), events after ?after_event, and the status."""
    project, _ = project_for_page(user=request.user, slug=project)
    run = selectors.run_get(project=project, run_id=run_id)
    names = [n for n in request.GET.getlist("name") if n] or None
    history = selectors.metric_history(run=run, after_step=_int(request.GET.get("after_step")), names=names,
                                       max_points=min(5000, _int(request.GET.get("max_points"), 1000) or 1000))
    events = selectors.event_list(run=run, after_id=_int(request.GET.get("after_event")))
    return JsonResponse({**history, "events": [selectors.event_json(e) for e in events],
                         "run": {"id": str(run.pk), "status": run.status, "step": run.step,
                                 "steps_total": run.steps_total, "requested": run.requested}})


@require_POST
def run_control(request, project, run_id):
    project, _ = project_for_page(user=request.user, slug=project, min_role=Role.EDITOR)
    run = selectors.run_get(project=project, run_id=run_id)
    action = request.POST.get("action", "")
    try:
        run = run_request(run=run, action=action, actor=request.user, via="web")
    except RunError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, {"pause": "Pause requested.", "resume": "Resumed: queued for a worker.",
                                   "cancel": "Cancel requested."}[action])
        if action == "resume":
            run_enqueue(run)
    return redirect("runs:run_detail", project=project.slug, run_id=run.pk)


def run_compare(request, project):
    project, can_edit = project_for_page(user=request.user, slug=project)
    runs = selectors.runs_get(project=project, run_ids=request.GET.getlist("run")[:COMPARE_LIMIT])
    context = {"project": project, "can_edit": can_edit, "runs": runs,
               "choices": selectors.run_list(project=project)[:100]}
    if len(runs) >= 1:
        names = sorted({n for run in runs for n in selectors.metric_names(run=run)},
                       key=lambda n: (n != "reward/mean", not n.startswith("reward/"), n))
        wanted = [n for n in request.GET.getlist("metric") if n in names] or \
            [n for n in names if n.startswith("reward/") and n != "reward/slope_per_hour"][:6]
        context.update(metric_names=names, metrics=wanted,
                       figures=[{"name": n, "figure": figures.to_json(figures.compare_figure(n, runs))}
                                for n in wanted])
        base = runs[0]
        context["diffs"] = [{"run": other,
                             "bundle": spec_diff(_bundle_lock(base), _bundle_lock(other)),
                             "config": spec_diff(base.config, other.config)} for other in runs[1:]]
    return render(request, "runs/run_compare.html", context)


def _bundle_lock(run) -> dict:
    """What a run pinned: its bundle version and the version it resolved for every member."""
    pinned = {}
    for entry in (run.bundle.spec or {}).get("resolved", []):
        name, _, number = entry["ref"].rpartition("@")
        pinned[name] = f"@{number} {entry.get('content_hash', '')[:12]}"
    return {"bundle": run.bundle.ref, "pinned": pinned}
