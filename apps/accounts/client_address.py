"""The address a request comes from, for log-in throttling (django-axes' AXES_CLIENT_IP_CALLABLE).

Without proxies (settings.PROXIES = 0) it is REMOTE_ADDR, and X-Forwarded-For is ignored: a client can write
anything there. Behind N proxies it is the Nth address from the right of X-Forwarded-For — the one the outermost
of our proxies appended, which the client cannot forge — as Werkzeug's ProxyFix(x_for=N) reads it. Written here
because django-ipware counts only the proxies listed inside the header, and a single nginx lists none.
"""

from django.conf import settings


def client_address(request) -> str | None:
    remote = request.META.get("REMOTE_ADDR")
    if not settings.PROXIES:
        return remote
    forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
    return forwarded[-settings.PROXIES] if len(forwarded) >= settings.PROXIES else remote
