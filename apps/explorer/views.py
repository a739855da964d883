"""The explorer's one view: check the login and the project membership, then hand the request to the project's
Dash app. Nothing reaches Dash without passing here, so every Dash endpoint (page, layout, dependencies,
callbacks, component bundles) sits behind the studio's login, project permissions and CSRF check."""

from __future__ import annotations

import json

from django.http import HttpResponseNotFound, JsonResponse
from django.middleware.csrf import get_token
from django.template.loader import render_to_string

from apps.accounts.selectors import project_for_user

from .dash_app import NAVIGATION, explorer_app
from .wsgi_bridge import call_wsgi


def explorer(request, project, rest):
    project = project_for_user(user=request.user, slug=project)
    if request.method == "GET" and not rest:
        get_token(request)  # sets Django's csrftoken cookie, which Dash sends back as X-CSRFToken on callbacks
    app = explorer_app(project)
    if rest == "_dash-update-component":
        problem = _callback_problem(app, request.body)
        if problem:
            return JsonResponse({"detail": problem}, status=400)
    response = call_wsgi(app.server, request)
    if not rest:
        response._csp_update = {"script-src": app.csp_hashes()}  # Dash's own inline scripts, by their hashes
        navigation = render_to_string("_topnav.html", {"project": project}, request=request)
        response.content = response.content.replace(NAVIGATION.encode(), navigation.encode(), 1)
    if rest.startswith("_dash-component-suites/") and response.status_code >= 500:
        # Dash fails on a bundle it does not serve (a mistyped or traversal path: nothing is read): not found.
        return HttpResponseNotFound("No such explorer file.")
    return response


def _callback_problem(app, body: bytes) -> str | None:
    """Why a callback request is not one this explorer's page could send, or None. Dash answers such a request
    with a 500; it is the caller's mistake."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return "the callback request is not JSON"
    if not isinstance(payload, dict) or payload.get("output") not in app.callback_map:
        return "the callback request names no callback of this explorer"
    if not isinstance(payload.get("inputs"), list) or not all(isinstance(i, dict) for i in payload["inputs"]):
        return "the callback request's inputs are not a list of inputs"
    return None
