"""The explorer's one view: check the login and the project membership, then hand the request to the project's
Dash app. Nothing reaches Dash without passing here, so every Dash endpoint (page, layout, dependencies,
callbacks, component bundles) sits behind the studio's login, project permissions and CSRF check."""

from __future__ import annotations

from django.middleware.csrf import get_token

from apps.accounts.selectors import project_for_user

from .dash_app import explorer_app
from .wsgi_bridge import call_wsgi


def explorer(request, project, rest):
    project = project_for_user(user=request.user, slug=project)
    if request.method == "GET" and not rest:
        get_token(request)  # sets Django's csrftoken cookie, which Dash sends back as X-CSRFToken on callbacks
    return call_wsgi(explorer_app(project).server, request)
