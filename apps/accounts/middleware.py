from django.conf import settings
from django.contrib.auth.views import redirect_to_login

# The API authenticates its own requests (tokens or session) and answers 401 in JSON; static files are public.
# /metrics, /healthz and /readyz are for scrapers and orchestrators (apps/operations/metrics.py).
OPEN_PREFIXES = ("/accounts/login/", "/static/", "/api/", "/metrics", "/healthz", "/readyz")


class LoginRequiredEverywhere:
    """Every page needs a login: the studio holds a team's private environments and runs."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.user.is_authenticated and not request.path.startswith(OPEN_PREFIXES):
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        return self.get_response(request)
