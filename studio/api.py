"""The REST API, mounted at /api/v1/ (studio/urls.py); its OpenAPI document is /api/v1/openapi.json.

Callers authenticate with an API token (`Authorization: Bearer pts_...`) or, from the browser, with their
session. The interactive docs page is off: ninja's Swagger page loads its scripts from a CDN unless "ninja" is
in INSTALLED_APPS, and the studio never uses a CDN.
"""

from ninja import NinjaAPI, Router, Status

from apps.accounts.api import router as accounts_router
from apps.accounts.api_auth import api_auth
from apps.common.api_errors import ErrorOut, register_exception_handlers
from apps.common.json_body import StrictJSONParser
from apps.evals.api import router as evals_router
from apps.registry.api import router as registry_router
from apps.review.api import router as review_router
from apps.runs.api import router as runs_router
from apps.sso.api import router as sso_router


class StudioAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation) -> str:
        # "publish_version" rather than ninja's "apps_registry_api_publish_version", for generated clients.
        return operation.view_func.__name__


api = StudioAPI(
    title="Posttrain Studio API",
    version="1",
    description="Definitions, versions, aliases, task instances and bundles of Posttrain Studio projects, and the "
                "training runs on them, and the review of their trajectories.",
    urls_namespace="api-v1",
    openapi_url="/openapi.json",
    docs_url=None,
    auth=api_auth,
    parser=StrictJSONParser(),
)
register_exception_handlers(api)
api.add_router("", accounts_router)
api.add_router("", registry_router)
api.add_router("", runs_router)
api.add_router("", review_router)
api.add_router("", evals_router)
api.add_router("", sso_router)

# Registered last, so it only sees paths no endpoint matched: without it Django would answer those with an
# HTML 404 page.
unmatched = Router()


@unmatched.api_operation(["GET", "POST", "PUT", "PATCH", "DELETE"], "/{path:rest}", auth=None,
                         response={404: ErrorOut}, include_in_schema=False)
def no_such_endpoint(request, rest: str):
    return Status(404, {"detail": f"No API endpoint matches {request.method} {request.path}. Check the path "
                                  "(slugs are lowercase letters, digits and hyphens; they cannot contain '/'); "
                                  "every endpoint is listed in /api/v1/openapi.json."})


api.add_router("", unmatched)
