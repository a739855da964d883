"""Settings come from the environment (12-factor); the defaults are the embedded, single-machine studio.

DATABASE_URL  defaults to a SQLite file under STUDIO_DATA_DIR; set postgres://... for PostgreSQL.
REDIS_URL     optional; when set, Channels and Celery use Redis, otherwise they run in-process.
SECRET_KEY    required when DEBUG is off; a development key is derived for the embedded default.
"""

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("STUDIO_DATA_DIR", BASE_DIR / "var"))
DATA_DIR.mkdir(parents=True, exist_ok=True)


def env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = env_flag("DEBUG", True)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise RuntimeError("SECRET_KEY must be set when DEBUG is off.")
    # Only for the embedded development default: never used once DEBUG is off.
    SECRET_KEY = "dev-only-insecure-key-set-SECRET_KEY-in-production"

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
    "apps.accounts",
    "apps.registry",
    "apps.runs",
    "apps.trajectories",
    "apps.benchmarks",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "apps.accounts.middleware.LoginRequiredEverywhere",
]

ROOT_URLCONF = "studio.urls"
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
            ],
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
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Celery: with REDIS_URL the queues (gpu, rollout, verify) live in Redis and separate workers serve them;
# without it tasks run in the calling process, which is the embedded default.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL or "memory://")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", REDIS_URL or "cache+memory://")
CELERY_TASK_ALWAYS_EAGER = not (REDIS_URL or os.environ.get("CELERY_BROKER_URL"))
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ROUTES = {"workers.tasks.train_run": {"queue": "gpu"}, "workers.tasks.execute_tool_call": {"queue": "rollout"},
                      "workers.tasks.verify_trajectory": {"queue": "verify"}, "workers.tasks.runs_watchdog": {"queue": "gpu"}}
CELERY_BEAT_SCHEDULE = {"runs-watchdog": {"task": "workers.tasks.runs_watchdog",
                                          "schedule": float(os.environ.get("STUDIO_RUN_WATCHDOG_SECONDS", 15))}}
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 4}},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on every start without it
# Whitenoise serves static/ straight from the finders in DEBUG; no CDN is ever used.
WHITENOISE_USE_FINDERS = True

# Request bodies above this are refused (the API answers 413) before any parsing (specs are small; instances go in bulk files).
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("STUDIO_MAX_REQUEST_BYTES", 4 * 1024 * 1024))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
}

# Sandboxes: the backend that runs model-written code (process: bubblewrap, the embedded default; docker).
SANDBOX_BACKEND = os.environ.get("STUDIO_SANDBOX_BACKEND", "process")
SANDBOX_STATUS_DIR = DATA_DIR / "sandbox-pools"  # running pools publish their state here for `sandbox pool-status`

# The judge layer: any OpenAI-compatible endpoint. Without JUDGE_BASE_URL, judge checks report infra_error
# (never a reward). Prices turn token counts into the cost each verdict records.
JUDGE_BASE_URL = os.environ.get("JUDGE_BASE_URL", "")
JUDGE_API_KEY = os.environ.get("JUDGE_API_KEY", "")
JUDGE_TIMEOUT_SECONDS = float(os.environ.get("JUDGE_TIMEOUT_SECONDS", 60))
JUDGE_MAX_CONCURRENCY = int(os.environ.get("JUDGE_MAX_CONCURRENCY", 8))
JUDGE_PRICE_PER_1K_INPUT_TOKENS = float(os.environ.get("JUDGE_PRICE_PER_1K_INPUT_TOKENS", 0))
JUDGE_PRICE_PER_1K_OUTPUT_TOKENS = float(os.environ.get("JUDGE_PRICE_PER_1K_OUTPUT_TOKENS", 0))

# Training runs. A worker heartbeats its run every 2 s; a run whose heartbeat is older than RUN_STALE_SECONDS is
# presumed lost and queued again (the watchdog: Celery beat, or the embedded runner), to resume from its last
# checkpoint. REMOTE_ROLLOUTS sends tool calls and verifications to the rollout and verify queues.
RUN_STALE_SECONDS = float(os.environ.get("STUDIO_RUN_STALE_SECONDS", 60))
REMOTE_ROLLOUTS = env_flag("STUDIO_REMOTE_ROLLOUTS", not CELERY_TASK_ALWAYS_EAGER)
# The embedded studio trains in the web process (a thread) when this is on; `make demo` turns it on.
EMBEDDED_RUNNER = env_flag("STUDIO_EMBEDDED_RUNNER", False)
# Seconds of CPU pretraining for the built-in demo base model (cached per bundle under DATA_DIR/models).
DEMO_PRETRAIN_SECONDS = float(os.environ.get("STUDIO_DEMO_PRETRAIN_SECONDS", 75))
# Cost per task: policy compute (the accelerator the model runs on, the CPU here) and sandbox CPU, per hour.
GPU_PRICE_PER_HOUR = float(os.environ.get("STUDIO_GPU_PRICE_PER_HOUR", 2.50))
SANDBOX_CPU_PRICE_PER_HOUR = float(os.environ.get("STUDIO_SANDBOX_CPU_PRICE_PER_HOUR", 0.05))
