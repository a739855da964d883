"""The project's members page: who holds which role, and (owners) which identity-provider groups give which."""

from django import forms
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from apps.accounts.models import Role
from apps.accounts.selectors import project_for_user, role_of
from apps.common.errors import StudioError

from .models import GroupRoleMapping
from .selectors import mapping_list, member_list, sign_on_providers
from .services import mapping_delete, mapping_set


class MappingForm(forms.Form):
    provider = forms.ChoiceField(choices=())
    group = forms.CharField(max_length=255, help_text="As the provider spells it in its groups claim.")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["provider"].choices = [(pid, p["name"]) for pid, p in sign_on_providers().items()]


def members(request, project):
    scope = project_for_user(user=request.user, slug=project)
    is_owner = role_of(user=request.user, project=scope) == Role.OWNER
    form = MappingForm(request.POST if request.method == "POST" and is_owner else None)
    status = 200
    if request.method == "POST":
        scope = project_for_user(user=request.user, slug=project, min_role=Role.OWNER)
        if "delete" in request.POST:
            mapping = get_object_or_404(GroupRoleMapping, pk=request.POST["delete"], project=scope)
            mapping_delete(mapping=mapping, actor=request.user)
            messages.success(request, f"Removed the mapping of {mapping.provider} group {mapping.group}; the role "
                                      "it gave goes at each member's next login.")
            return redirect(reverse("sso:members", kwargs={"project": scope.slug}))
        if form.is_valid():
            try:
                mapping_set(project=scope, actor=request.user, **form.cleaned_data)
            except StudioError as exc:
                form.add_error(exc.field or None, str(exc))
            else:
                messages.success(request, f"Members of {form.cleaned_data['provider']} group "
                                          f"{form.cleaned_data['group']} get {form.cleaned_data['role']} here at "
                                          "their next login.")
                return redirect(reverse("sso:members", kwargs={"project": scope.slug}))
        status = 400
    return render(request, "sso/members.html", {
        "project": scope, "is_owner": is_owner, "members": member_list(project=scope),
        "mappings": mapping_list(project=scope) if is_owner else [], "form": form,
        "providers": sign_on_providers()}, status=status)
