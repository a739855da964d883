"""Account pages: API tokens. Login and logout are django.contrib.auth's own views (see urls.py)."""

from datetime import timedelta
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from . import services
from .models import ApiToken, Project, Role, TokenScope
from .selectors import api_token_list, audit_list, project_for_user, project_list_for_user

EXPIRIES = [("7", "in 7 days"), ("30", "in 30 days"), ("90", "in 90 days"), ("365", "in a year"),
            ("", "never (until revoked)")]
# A token that never expires outlives the laptop or the CI job it was made for: one is offered, not preselected.
DEFAULT_EXPIRY = "90"


class ApiTokenCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Where it will be used, e.g. laptop CLI or CI.")
    project = forms.ModelChoiceField(queryset=Project.objects.none(), empty_label=None,
                                     help_text="A token acts in this one project.")
    # A SCIM token is no project's: an operator makes it with `manage.py scim_token create`.
    scope = forms.ChoiceField(choices=[c for c in TokenScope.choices if c[0] != TokenScope.SCIM],
                              initial=TokenScope.READ,
                              help_text="At most this, and never more than your own role.")
    expires = forms.ChoiceField(choices=EXPIRIES, required=False, label="Expires", initial=DEFAULT_EXPIRY)

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = project_list_for_user(user=user).order_by("slug")


def _navigation_project(request) -> Project | None:
    """The project whose navigation the tokens page keeps: the one it was opened from (?project=, which the
    navigation's link sends), else the user's first. The page itself is the user's, across projects."""
    slug = request.GET.get("project")
    if slug:
        return project_for_user(user=request.user, slug=slug)
    return project_list_for_user(user=request.user).first()


def api_tokens(request):
    project = _navigation_project(request)
    form = ApiTokenCreateForm(request.POST if request.method == "POST" else None, user=request.user,
                              initial={"project": project})
    plaintext = None
    if form.is_valid():
        days = form.cleaned_data["expires"]
        # Rendered straight from the POST, never redirected: the plaintext exists only in this response.
        try:
            _, plaintext = services.api_token_create(
                user=request.user, name=form.cleaned_data["name"], project=form.cleaned_data["project"],
                scope=form.cleaned_data["scope"], via="web",
                expires_at=timezone.now() + timedelta(days=int(days)) if days else None)
        except ValueError as exc:  # a scope above the user's role there (the form offers only their projects)
            form.add_error("scope", str(exc))
        else:
            form = ApiTokenCreateForm(user=request.user, initial={"project": project})
    tokens = api_token_list(user=request.user)
    status = 400 if form.is_bound and form.errors else 200
    return render(request, "accounts/api_tokens.html",
                  {"tokens": tokens, "form": form, "plaintext": plaintext, "project": project}, status=status)


@require_POST
def api_token_revoke(request, token_id):
    # Scoped to the user: someone else's token id is a 404, not a revoke.
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    if token.revoked_at is None:
        services.api_token_revoke(token=token, actor=request.user, via="web")
        messages.success(request, f"Revoked the token {token.name} (pts_{token.prefix}_…); it no longer works.")
    return redirect(f"{reverse('api_tokens')}?{urlencode({'project': token.project.slug})}" if token.project
                    else reverse("api_tokens"))


def audit_log(request, project):
    """Every write in a project, newest first: who published, moved an alias, changed a role. Owners only."""
    scope = project_for_user(user=request.user, slug=project, min_role=Role.OWNER)
    return render(request, "accounts/audit_log.html",
                  {"project": scope, "events": audit_list(project=scope, limit=500)})
