from django.conf import settings
from django.contrib.auth.views import redirect_to_login

# The API authenticates its own requests (tokens or session) and answers 401 in JSON; static files are public.
# /metrics, /healthz and /readyz are for scrapers and orchestrators (apps/operations/metrics.py). /scim/ answers the
# identity provider with its own bearer token, or a SCIM 401 (apps/sso/scim_auth.py). /accounts/sso/ is the identity
# providers' login and callback (apps/sso/login_urls.py).
OPEN_PREFIXES = ("/accounts/login/", "/accounts/sso/", "/static/", "/api/", "/metrics", "/healthz", "/readyz",
                 "/scim/")


class LoginRequiredEverywhere:
    """Every page needs a login: the studio holds a team's private environments and runs."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.user.is_authenticated and not request.path.startswith(OPEN_PREFIXES):
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        return self.get_response(request)
