"""Settings come from the environment (12-factor); the defaults are the embedded, single-machine studio.

This is the only module that reads environment variables; everything else reads `django.conf.settings`, and the
engine (workers/) is handed what it needs by apps/common/wiring.py. Importing it has no side effects: the
directories under STUDIO_DATA_DIR are made by whoever writes there.

DATABASE_URL  defaults to a SQLite file under STUDIO_DATA_DIR; set postgres://... for PostgreSQL.
REDIS_URL     optional; when set, Channels and Celery use Redis and the studio runs on services (workers on
              queues, possibly on other machines). Without it (and without CELERY_BROKER_URL) the studio is
              EMBEDDED: one process, in-process tasks and channel layer.
STUDIO_STORAGE_URL  where blobs live (checkpoints, artifacts, converted models): STUDIO_DATA_DIR by default; an
              S3-compatible bucket, s3://bucket/prefix, when several hosts share the work (its endpoint and
              credentials: the AWS SDK's variables, AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
DEBUG         off unless asked for (DEBUG=1): debug pages show settings and tracebacks.
SECRET_KEY    required, except with DEBUG on; `make demo` keeps a random one in STUDIO_DATA_DIR/secret_key,
              which is read when SECRET_KEY is not set.
"""

import os
import re
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("STUDIO_DATA_DIR", BASE_DIR / "var"))


def env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _secret_key(debug: bool) -> str:
    key = os.environ.get("SECRET_KEY", "")
    if key:
        return key
    kept = DATA_DIR / "secret_key"
    if kept.is_file():
        return kept.read_text().strip()
    if debug:
        return "dev-only-insecure-key-set-SECRET_KEY-in-production"  # never used once DEBUG is off
    raise ImproperlyConfigured(f"SECRET_KEY is not set: set it in the environment, or keep one in {kept} "
                               "(`make demo` makes one there), or set DEBUG=1 for a development key")


DEBUG = env_flag("DEBUG", False)
SECRET_KEY = _secret_key(DEBUG)

ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",")]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "axes",
    # Sign-on with the company's identity provider (apps/sso): allauth's OpenID Connect provider, its flow
    # completed and its ID-token checks tightened by apps/sso/oidc.
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "allauth.socialaccount.providers.saml",
    "apps.accounts",
    "apps.sso",
    "apps.registry",
    "apps.task_import",
    "apps.runs",
    "apps.trajectories",
    "apps.review",
    "apps.datasets",
    "apps.evals",
    "apps.authoring",
    "apps.environments",
    "apps.operations",
    "apps.demo",
]

MIDDLEWARE = [
    # Outermost: every request's latency, whatever answers it (apps/operations/metrics.py).
    "apps.operations.metrics.RequestMetrics",
    # Then: whatever answers an /api/ request with an error, the client reads JSON.
    "apps.common.api_errors.JsonErrorsUnderApi",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    # A signed-on person whose provider's groups no longer give them any role is signed out at their next request.
    "apps.sso.middleware.SignOnRecheck",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Before the log-in wall, so that the wall's own redirects carry the policy too.
    "csp.middleware.CSPMiddleware",
    "apps.sso.middleware.LoginFormsReachProviders",
    "apps.accounts.middleware.LoginRequiredEverywhere",
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks: it answers a locked-out login
]

ROOT_URLCONF = "studio.urls"
DEFAULT_EXCEPTION_REPORTER_FILTER = "studio.error_reports.StudioExceptionReporterFilter"
WSGI_APPLICATION = "studio.wsgi.application"
ASGI_APPLICATION = "studio.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "apps.accounts.context_processors.projects",
                "apps.sso.context_processors.sign_on",
            ],
            "builtins": ["apps.common.json_entries"],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'studio.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded default: several threads (web, in-process workers) share one file.
    DATABASES["default"]["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    # A consumer waits for its next message with BZPOPMIN, which Redis answers empty after channels_redis's
    # brpop_timeout (5 s). redis-py 8 reads every reply within a default socket_timeout of 5 s as well, so an idle
    # socket's wait ended in "Timeout reading from ..." and the consumer died with its websocket (a run page then
    # reconnected every few seconds). The read waits longer than the block; a Redis that stops answering is still
    # noticed, 30 s on.
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                  "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}]}}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# The embedded studio: no broker, so no workers on queues. Runs train in the web process (EMBEDDED_TRAINING) or
# in a `train --headless` command; tasks run in the calling process.
EMBEDDED = not (REDIS_URL or os.environ.get("CELERY_BROKER_URL"))

# Celery: on services the queues (gpu, rollout, verify) live in the broker and separate workers serve them.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL or "memory://")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", REDIS_URL or "cache+memory://")
CELERY_TASK_ALWAYS_EAGER = EMBEDDED
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ROUTES = {"workers.tasks.train_run": {"queue": "gpu"}, "workers.tasks.runs_watchdog": {"queue": "gpu"},
                      "workers.tasks.execute_tool_call": {"queue": "rollout"},
                      "workers.tasks.verify_trajectory": {"queue": "verify"}}
CELERY_BEAT_SCHEDULE = {"runs-watchdog": {"task": "workers.tasks.runs_watchdog",
                                          "schedule": float(os.environ.get("STUDIO_RUN_WATCHDOG_SECONDS", 15))}}
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Log-ins are throttled (django-axes): after AXES_FAILURE_LIMIT wrong passwords within the cool-off for one user
# name, or from one address, logging in is refused for that name or address until the cool-off has passed. A
# right password does not reset the count: it would also reset the address's count, and an attacker with an
# account of their own could then guess another's password without end.
# Passwords go through apps/sso/backends.py's LocalPasswords (Django's ModelBackend, refusing every account but the
# break-glass one when STUDIO_LOCAL_LOGIN=off). allauth's own backend is not listed: it would check passwords too,
# outside that switch; a sign-on login names LocalPasswords as its session's backend, which only reads users.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "apps.sso.backends.LocalPasswords"]
AXES_FAILURE_LIMIT = int(os.environ.get("STUDIO_LOGIN_FAILURE_LIMIT", 5))
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("STUDIO_LOGIN_COOLOFF_MINUTES", 15)))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = False
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False
# Behind N reverse proxies (STUDIO_PROXIES=N), the client's address is the one they add to X-Forwarded-For;
# otherwise every user would share the proxy's address, and one attacker's failures would lock them all out.
# Without proxies the header is ignored: a client could write anything there (apps/accounts/client_address.py).
PROXIES = int(os.environ.get("STUDIO_PROXIES", 0))
AXES_CLIENT_IP_CALLABLE = "apps.accounts.client_address.client_address"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
# How long a login lasts (a browser session; API tokens have their own expiry). A signed-on person's roles are
# recomputed from their provider's groups at every login, so this also bounds how long a group change there takes
# to reach a role here (without SCIM, which applies it at once).
SESSION_COOKIE_AGE = int(float(os.environ.get("STUDIO_SESSION_HOURS", 12)) * 3600)


def _sign_on_id(name: str, setting: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", name):
        raise ImproperlyConfigured(f"{name!r} in {setting} is not a provider id: use 1-63 lowercase letters, digits "
                                   "and hyphens, e.g. okta or entra-id")
    return name


def _oidc_provider(provider_id: str) -> dict:
    """One OpenID Provider from STUDIO_OIDC_<ID>_* (ID: the provider id in capitals, '-' as '_'), as allauth's
    settings-defined app. The client secret is the operator's, from the environment, as STUDIO_ENDPOINT_KEY_*:
    never from anything an editor writes or the database holds."""
    prefix = f"STUDIO_OIDC_{provider_id.upper().replace('-', '_')}_"
    missing = [prefix + name for name in ("ISSUER", "CLIENT_ID") if not os.environ.get(prefix + name)]
    if missing:
        raise ImproperlyConfigured(f"STUDIO_OIDC_PROVIDERS names {provider_id!r}, but {', '.join(missing)} "
                                   "is not set (the README's Sign-on section lists each provider's settings)")
    issuer = os.environ[prefix + "ISSUER"].rstrip("/")
    scopes = os.environ.get(prefix + "SCOPES", "openid profile email").split()
    return {"provider_id": provider_id, "name": os.environ.get(prefix + "NAME", provider_id),
            "client_id": os.environ[prefix + "CLIENT_ID"], "secret": os.environ.get(prefix + "CLIENT_SECRET", ""),
            "settings": {"server_url": issuer, "issuer": issuer, "scope": scopes, "oauth_pkce_enabled": True,
                         "groups_claim": os.environ.get(prefix + "GROUPS_CLAIM", "groups"),
                         # The claim compared with the SCIM userName of the people this provider's SCIM token
                         # provisioned, to link their first login to them (apps/sso/services.py).
                         "scim_match": os.environ.get(prefix + "SCIM_MATCH", "email")}}


# STUDIO_OIDC_PROVIDERS=okta,keycloak: the OpenID Providers whose users may log in (each configured by its own
# STUDIO_OIDC_<ID>_ISSUER, _CLIENT_ID, _CLIENT_SECRET, and optionally _NAME, _SCOPES, _GROUPS_CLAIM,
# _SCIM_MATCH). Who is admitted, and with which roles, is decided by the projects' group mappings (apps/sso).
OIDC_PROVIDERS = [_oidc_provider(_sign_on_id(name.strip(), "STUDIO_OIDC_PROVIDERS"))
                  for name in os.environ.get("STUDIO_OIDC_PROVIDERS", "").split(",") if name.strip()]
SOCIALACCOUNT_PROVIDERS = {"openid_connect": {
    # Our subclass of allauth's provider: a nonce in every request, the ID token's signature always checked, ...
    "provider_class": "apps.sso.oidc.provider.StudioOpenIDConnectProvider",
    "OAUTH_PKCE_ENABLED": True,
    "APPS": OIDC_PROVIDERS,
}}
# provider id -> what the login page, the members page and apps/sso need of it; SAML providers join it below.
SIGN_ON_PROVIDERS = {app["provider_id"]: {"name": app["name"], "protocol": "oidc",
                                          "groups_claim": app["settings"]["groups_claim"],
                                          "scim_match": app["settings"]["scim_match"]} for app in OIDC_PROVIDERS}


def _saml_provider(provider_id: str) -> dict:
    """One SAML 2.0 identity provider from STUDIO_SAML_<ID>_* (ID: the provider id in capitals, '-' as '_'), as
    allauth's settings-defined app: its metadata URL (…_METADATA_URL, with …_ENTITY_ID), or its entity id, single
    sign-on URL and signing certificate (…_ENTITY_ID, …_SSO_URL, …_X509CERT or …_X509CERT_FILE). Assertions must be
    signed, logins the IdP starts on its own are refused, and apps/sso/saml.py adds the audience, recipient and
    replay checks allauth leaves out."""
    prefix = f"STUDIO_SAML_{provider_id.upper().replace('-', '_')}_"
    env = {name: os.environ.get(prefix + name, "") for name in (
        "METADATA_URL", "ENTITY_ID", "SSO_URL", "X509CERT", "X509CERT_FILE", "NAME", "GROUPS_ATTRIBUTE",
        "UID_ATTRIBUTE", "EMAIL_ATTRIBUTE", "SP_ENTITY_ID", "SCIM_MATCH")}
    if env["X509CERT_FILE"]:
        env["X509CERT"] = Path(env["X509CERT_FILE"]).read_text()
    if env["METADATA_URL"] and env["ENTITY_ID"]:
        idp = {"metadata_url": env["METADATA_URL"], "entity_id": env["ENTITY_ID"]}
    elif env["ENTITY_ID"] and env["SSO_URL"] and env["X509CERT"]:
        idp = {"entity_id": env["ENTITY_ID"], "sso_url": env["SSO_URL"], "x509cert": env["X509CERT"]}
    else:
        raise ImproperlyConfigured(f"STUDIO_SAML_PROVIDERS names {provider_id!r}: set {prefix}METADATA_URL and "
                                   f"{prefix}ENTITY_ID, or {prefix}ENTITY_ID, {prefix}SSO_URL and {prefix}X509CERT "
                                   "(or _X509CERT_FILE) (the README's Sign-on section lists each provider's settings)")
    mapping = {"uid": [a for a in [env["UID_ATTRIBUTE"]] if a],  # empty: the NameID
               "email": [env["EMAIL_ATTRIBUTE"] or "email", "urn:oid:0.9.2342.19200300.100.1.3",
                         "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/emailaddress"],
               "first_name": ["givenName", "urn:oid:2.5.4.42",
                              "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/givenname"],
               "last_name": ["sn", "surname", "urn:oid:2.5.4.4",
                             "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/surname"],
               "username": ["username", "uid"]}
    # SCIM_MATCH: the attribute compared with the SCIM userName to link a first login (default the NameID).
    settings = {"idp": idp, "attribute_mapping": mapping, "groups_claim": env["GROUPS_ATTRIBUTE"] or "groups",
                "scim_match": env["SCIM_MATCH"] or "nameid",
                "advanced": {"strict": True, "want_assertion_signed": True, "reject_idp_initiated_sso": True,
                             "allow_single_label_domains": True, "reject_deprecated_algorithm": True}}
    if env["SP_ENTITY_ID"]:
        settings["sp"] = {"entity_id": env["SP_ENTITY_ID"]}
    return {"provider_id": provider_id, "name": env["NAME"] or provider_id, "client_id": provider_id,
            "settings": settings}


# STUDIO_SAML_PROVIDERS=adfs,okta-saml: the SAML 2.0 identity providers whose users may log in (each configured by
# its STUDIO_SAML_<ID>_* settings above; the studio's SP metadata is at /accounts/sso/saml/<id>/metadata/).
SAML_PROVIDERS = [_saml_provider(_sign_on_id(name.strip(), "STUDIO_SAML_PROVIDERS"))
                  for name in os.environ.get("STUDIO_SAML_PROVIDERS", "").split(",") if name.strip()]
SOCIALACCOUNT_PROVIDERS["saml"] = {"provider_class": "apps.sso.saml.StudioSAMLProvider", "APPS": SAML_PROVIDERS}
SIGN_ON_PROVIDERS.update({app["provider_id"]: {"name": app["name"], "protocol": "saml",
                                               "groups_claim": app["settings"]["groups_claim"],
                                               "scim_match": app["settings"]["scim_match"]}
                          for app in SAML_PROVIDERS})
# A provider's SCIM groups (apps/sso/scim.py, with the SCIM token `manage.py scim_token create --provider <id>`
# makes) are that provider's groups: the same mappings give their members roles.
ACCOUNT_ADAPTER = "apps.sso.adapters.StudioAccountAdapter"
SOCIALACCOUNT_ADAPTER = "apps.sso.adapters.StudioSocialAccountAdapter"
# Accounts are made by apps/sso (just in time, for people a mapping admits), never linked by e-mail address: a
# provider that lets its users type any address would otherwise hand them another person's studio account.
SOCIALACCOUNT_EMAIL_AUTHENTICATION = False
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"
ACCOUNT_EMAIL_VERIFICATION = "none"
SOCIALACCOUNT_STORE_TOKENS = False
# "on": anyone may log in with a password made in the studio; "off": only STUDIO_BREAK_GLASS_USER may (for when the
# identity provider is down), and the login page offers only the providers. API tokens work either way.
LOCAL_LOGIN = env_flag("STUDIO_LOCAL_LOGIN", True)
BREAK_GLASS_USER = os.environ.get("STUDIO_BREAK_GLASS_USER", "")

# Content-Security-Policy: scripts only from the studio itself (every page's JavaScript is a file in static/; the
# explorer adds the hashes of Dash's own inline scripts); styles inline too, since Plotly and Dash set them from
# script; images also from data: and blob: URLs (Plotly's exports, rendered screenshots); nothing framed.
CONTENT_SECURITY_POLICY = {"DIRECTIVES": {
    "default-src": ["'self'"], "script-src": ["'self'"], "style-src": ["'self'", "'unsafe-inline'"],
    "img-src": ["'self'", "data:", "blob:"], "font-src": ["'self'", "data:"], "connect-src": ["'self'"],
    "object-src": ["'none'"], "base-uri": ["'self'"], "form-action": ["'self'"], "frame-ancestors": ["'none'"],
}}

# Behind TLS (a proxy that terminates it and sets X-Forwarded-Proto), STUDIO_HTTPS=1 marks the cookies Secure,
# redirects plain HTTP, and sends HSTS for STUDIO_HSTS_SECONDS (off by default: HSTS is hard to take back).
HTTPS = env_flag("STUDIO_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None
SECURE_HSTS_SECONDS = int(os.environ.get("STUDIO_HSTS_SECONDS", 0))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_flag("STUDIO_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_flag("STUDIO_HSTS_PRELOAD", False)
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# `collectstatic` (the Docker image) writes here; the embedded studio serves static/ straight from the finders.
STATIC_ROOT = Path(os.environ["STUDIO_STATIC_ROOT"]) if os.environ.get("STUDIO_STATIC_ROOT") else None
WHITENOISE_USE_FINDERS = True  # no CDN is ever used

# Request bodies above this are refused (the API answers 413) before any parsing (specs are small; instances go in
# bulk files).
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("STUDIO_MAX_REQUEST_BYTES", 4 * 1024 * 1024))

# STUDIO_LOG_FORMAT=json: one JSON object a line (python-json-logger) with the run, attempt and trajectory ids of
# what the line is about (workers/telemetry.py log_context), for a log pipeline; text otherwise.
LOG_FORMAT = os.environ.get("STUDIO_LOG_FORMAT", "text")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "workers.telemetry.LogContextFilter"}},
    "formatters": {"json": {"()": "pythonjsonlogger.json.JsonFormatter",
                            "fmt": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
                            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"}}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["context"],
                             **({"formatter": "json"} if LOG_FORMAT == "json" else {})}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
}

# /metrics requires `Authorization: Bearer <this>` when set (apps/operations/metrics.py).
METRICS_TOKEN = os.environ.get("STUDIO_METRICS_TOKEN", "")

# Sandboxes: the backend that runs model-written code (process: bubblewrap, the embedded default; docker).
SANDBOX_BACKEND = os.environ.get("STUDIO_SANDBOX_BACKEND", "process")
SANDBOX_STATUS_DIR = DATA_DIR / "sandbox-pools"  # running pools publish their state here for `sandbox pool-status`
# Built image layers (process backend) and containers' control sockets (docker backend): shared by every pool on
# the machine, outside the data directory because the sandboxes' own uids must reach them.
SANDBOX_LAYER_CACHE = Path(os.environ.get("STUDIO_SANDBOX_CACHE", "/var/tmp/posttrain-studio/layers"))
SANDBOX_DOCKER_CONTROL = Path(os.environ.get("STUDIO_DOCKER_CONTROL", "/var/tmp/posttrain-studio/docker"))
# Whether a sandbox image may ask for the network (limits.network: true). Such a sandbox shares the host's network
# (bubblewrap --share-net, Docker's host mode): model-written code reaches the host's loopback services (PostgreSQL,
# Redis) and the cloud's metadata address. Off: publishing such an image is refused, and one published before
# cannot start a sandbox.
SANDBOX_NETWORK = env_flag("STUDIO_SANDBOX_NETWORK", False)

# The judge layer: any OpenAI-compatible endpoint. Without JUDGE_BASE_URL, judge checks report infra_error
# (never a reward). Prices turn token counts into the cost each verdict records.
JUDGE_BASE_URL = os.environ.get("JUDGE_BASE_URL", "")
JUDGE_API_KEY = os.environ.get("JUDGE_API_KEY", "")
# The bearer token of the inference servers' weight endpoint (POST /v1/weights, workers/rl/serving/app.py): what
# `manage.py serve` requires and what a run generating on servers (inference_servers) sends. Empty: the servers
# take weights from loopback clients only.
INFERENCE_SERVER_TOKEN = os.environ.get("STUDIO_SERVE_WEIGHTS_TOKEN", "")
# Where a request a user aimed may go (eval endpoints, a run's inference servers: workers/egress.py): public
# addresses only, and the host names and CIDRs listed here (e.g. "127.0.0.0/8 ::1 localhost" for a server on this
# machine). Inference servers receive the run's weights and the weight token above: each must be listed here.
EGRESS_ALLOW = os.environ.get("STUDIO_EGRESS_ALLOW", "")
# The key that encrypts the API keys owners store for their projects' endpoints (apps/accounts/credentials.py), a
# Fernet key (base64 of 32 bytes; `python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key()
# .decode())"`): kept out of the database, so a copy of the database alone reveals no key. `make demo` keeps a random
# one in STUDIO_DATA_DIR/secrets_key (owner-only), read when STUDIO_SECRETS_KEY is not set. Empty: projects cannot
# store keys; endpoints use the operator's STUDIO_ENDPOINT_KEY_<NAME> variables only.
_KEPT_SECRETS_KEY = DATA_DIR / "secrets_key"
SECRETS_KEY = os.environ.get("STUDIO_SECRETS_KEY", "") or (
    _KEPT_SECRETS_KEY.read_text().strip() if _KEPT_SECRETS_KEY.is_file() else "")
JUDGE_TIMEOUT_SECONDS = float(os.environ.get("JUDGE_TIMEOUT_SECONDS", 60))
JUDGE_MAX_CONCURRENCY = int(os.environ.get("JUDGE_MAX_CONCURRENCY", 8))
JUDGE_PRICE_PER_1K_INPUT_TOKENS = float(os.environ.get("JUDGE_PRICE_PER_1K_INPUT_TOKENS", 0))
JUDGE_PRICE_PER_1K_OUTPUT_TOKENS = float(os.environ.get("JUDGE_PRICE_PER_1K_OUTPUT_TOKENS", 0))

# Training runs. A worker heartbeats its run every 2 s; a run whose heartbeat is older than RUN_STALE_SECONDS is
# presumed lost and queued again (the watchdog: Celery beat, or the embedded training thread), to resume from its last
# checkpoint. REMOTE_ROLLOUTS sends tool calls and verifications to the rollout and verify queues.
RUN_STALE_SECONDS = float(os.environ.get("STUDIO_RUN_STALE_SECONDS", 60))
# A heartbeat means progress: an attempt that neither rolls out, grades, records a step nor checkpoints (an
# evaluation: archives a batch) for RUN_STUCK_SECONDS stops heartbeating and is abandoned, so the watchdog resumes
# its run from its last checkpoint, on whichever worker claims it. Longer than any one step or update can take.
RUN_STUCK_SECONDS = float(os.environ.get("STUDIO_RUN_STUCK_SECONDS", 900))
# How long the embedded studio (`make demo`) may take to stop on SIGTERM or Ctrl-C (apps/runs/embedded.py): it
# stops claiming runs, abandons its attempts at their next check (left to be resumed), releases their sandboxes
# and exits; what is still running after this many seconds is cut short. A second signal exits at once.
STOP_SECONDS = float(os.environ.get("STUDIO_STOP_SECONDS", 20))
# How long a run's worker waits for a database that went away (restarted, failed over) before it stops and leaves
# the run to be resumed from its last checkpoint.
RUN_DATABASE_OUTAGE_SECONDS = float(os.environ.get("STUDIO_RUN_DATABASE_OUTAGE_SECONDS", 120))
REMOTE_ROLLOUTS = not EMBEDDED and env_flag("STUDIO_REMOTE_ROLLOUTS", True)
# How long a run waits for a rollout or verify worker to answer one call before it counts as an infrastructure
# error (the run goes on, and its events say which queue no worker serves).
REMOTE_TIMEOUT_SECONDS = float(os.environ.get("STUDIO_REMOTE_TIMEOUT_SECONDS", 300))
# The embedded studio trains queued runs in the web process (a thread) when this is on; `make demo` turns it on.
EMBEDDED_TRAINING = EMBEDDED and env_flag("STUDIO_EMBEDDED_TRAINING", False)
# Where a run may load a Hugging Face model from (its `model` setting is a directory inside one of these);
# colon-separated. Nothing outside them is read as a model, whoever queues the run.
MODEL_DIRS = [Path(p) for p in os.environ.get("STUDIO_MODEL_DIRS", str(DATA_DIR / "models")).split(":") if p]
# Where blobs live (workers/storage): checkpoints, trajectory artifacts, converted models. Empty: DATA_DIR itself, the
# embedded default. s3://bucket/prefix: an S3-compatible bucket that every host (web, workers) reads and writes, so
# a run resumes on any worker and a page shows a render another host wrote; each host keeps what it downloaded
# under DATA_DIR/cache. Built into a Storage by apps/common/wiring.py.
STORAGE_URL = os.environ.get("STUDIO_STORAGE_URL", "")
# What a host's cache of the object store (DATA_DIR/cache) may hold, in bytes, before its least recently used
# directories are evicted; and how long a storage call waits for an object store that does not answer before it
# fails. workers/storage reads the same variables wherever it runs; these are the studio's view of them.
STORAGE_CACHE_BYTES = int(float(os.environ.get("STUDIO_STORAGE_CACHE_BYTES", 20e9)))
STORAGE_OUTAGE_SECONDS = float(os.environ.get("STUDIO_STORAGE_OUTAGE_SECONDS", 120))
# Seconds of CPU pretraining for the built-in demo base model (cached per bundle under DATA_DIR/models).
DEMO_PRETRAIN_SECONDS = float(os.environ.get("STUDIO_DEMO_PRETRAIN_SECONDS", 75))
# Where `make demo` serves; the demo's seed prints its login address from it.
DEMO_URL = f"http://{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}/"
# Cost per task: policy compute (the accelerator the model runs on, the CPU here) and sandbox CPU, per hour.
GPU_PRICE_PER_HOUR = float(os.environ.get("STUDIO_GPU_PRICE_PER_HOUR", 2.50))
SANDBOX_CPU_PRICE_PER_HOUR = float(os.environ.get("STUDIO_SANDBOX_CPU_PRICE_PER_HOUR", 0.05))

# Task files uploaded in the browser (apps/task_import/views.py): the largest accepted, and the size above which
# the file is read in the background (a Celery task on the `studio` queue; a thread in the embedded studio).
TASK_UPLOAD_MAX_BYTES = int(os.environ.get("STUDIO_TASK_UPLOAD_MAX_BYTES", 2 * 2**30))
TASK_UPLOAD_BACKGROUND_BYTES = int(os.environ.get("STUDIO_TASK_UPLOAD_BACKGROUND_BYTES", 20 * 2**20))

# SCIM 2.0 provisioning at /scim/v2 (apps/sso/scim.py, on django-scim2): the identity provider creates, updates,
# deactivates and deletes people and keeps its groups there, with a bearer token of the scim scope (`manage.py
# scim_token create`). django-scim2's own settings, naming our adapters, filters and token check.
SCIM_SERVICE_PROVIDER = {
    "USER_ADAPTER": "apps.sso.scim.StudioScimUser",
    "GROUP_MODEL": "apps.sso.scim_models.ScimGroup",
    "GROUP_ADAPTER": "apps.sso.scim.StudioScimGroup",
    "USER_FILTER_PARSER": "apps.sso.scim_queries.UserFilterQuery",
    "GROUP_FILTER_PARSER": "apps.sso.scim_queries.GroupFilterQuery",
    "SERVICE_PROVIDER_CONFIG_MODEL": "apps.sso.scim.ServiceProviderConfig",
    "BASE_LOCATION_GETTER": "apps.sso.scim_auth.base_location",
    "GET_OBJECT_POST_PROCESSOR_GETTER": "apps.sso.scim_queries.object_post_processor_getter",
    "GET_QUERYSET_POST_PROCESSOR_GETTER": "apps.sso.scim_queries.queryset_post_processor_getter",
    "AUTH_CHECK_MIDDLEWARE": "apps.sso.scim_auth.SCIMTokenAuth",
    "AUTHENTICATION_SCHEMES": [{"type": "oauthbearertoken", "name": "Bearer token",
                                "description": "An API token of the scim scope: manage.py scim_token create"}],
    "WWW_AUTHENTICATE_HEADER": 'Bearer realm="scim"',
    "NETLOC": "unused",  # mandatory for django-scim2; locations come from the request (BASE_LOCATION_GETTER)
}
