"""The settings as a deployment meets them: read from the environment of a fresh interpreter (each test runs them
in a subprocess with an environment of its own, never this process's), safe when nothing is set, and clean under
`check --deploy` with the production variables. Also what every page sends: a Content-Security-Policy that lets
scripts come from the studio only."""

import json
import os
import subprocess
import sys

import pytest
from django.urls import reverse

from apps.accounts.services import api_token_create
from tests.support import ROOT

# A SECRET_KEY as a deployment makes one: long, random-looking, many distinct characters (check --deploy's W009).
PRODUCTION_KEY = "pX7#kq2M9v!cT4w^Zr8bN1y&Hs5e*Ld3jF6g@Qa0uE-oV+iK=R_tW(C)Y~G"
PRODUCTION = {"SECRET_KEY": PRODUCTION_KEY, "STUDIO_HTTPS": "1", "STUDIO_HSTS_SECONDS": "31536000",
              "STUDIO_HSTS_INCLUDE_SUBDOMAINS": "1", "STUDIO_HSTS_PRELOAD": "1", "ALLOWED_HOSTS": "studio.example.com"}


def environment(data_dir, **variables) -> dict:
    """Only what an interpreter needs to start, a data directory, and `variables`: no SECRET_KEY, DEBUG,
    DATABASE_URL or REDIS_URL leaks in from the environment the tests run in."""
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "TMPDIR") if name in os.environ}
    return {**base, "STUDIO_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE": "studio.settings", **variables}


def python(env: dict, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def settings_values(env: dict, *names: str) -> dict:
    """The named settings as a fresh interpreter loads them from `env`."""
    done = python(env, "import json, studio.settings as s\n"
                       f"print(json.dumps({{n: getattr(s, n) for n in {list(names)!r}}}))")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


# --- DEBUG and SECRET_KEY ------------------------------------------------------------------------------------


def test_debug_is_off_unless_asked_for(tmp_path):
    key = {"SECRET_KEY": "k" * 50}
    assert settings_values(environment(tmp_path, **key), "DEBUG") == {"DEBUG": False}
    assert settings_values(environment(tmp_path, **key, DEBUG="0"), "DEBUG") == {"DEBUG": False}
    assert settings_values(environment(tmp_path, **key, DEBUG="1"), "DEBUG") == {"DEBUG": True}


def test_without_a_secret_key_the_settings_refuse_to_load(tmp_path):
    done = python(environment(tmp_path / "data"), "import studio.settings")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: SECRET_KEY is not set"), done.stderr[-3000:]
    assert str(tmp_path / "data" / "secret_key") in last  # where a key may be kept instead
    # DEBUG=1 alone is enough for a development key.
    values = settings_values(environment(tmp_path / "data", DEBUG="1"), "DEBUG", "SECRET_KEY")
    assert values["DEBUG"] is True and values["SECRET_KEY"]


def test_a_key_kept_in_the_data_directory_is_read(tmp_path):
    (tmp_path / "secret_key").write_text("kept-in-the-data-directory-" + "x" * 40 + "\n")
    kept = settings_values(environment(tmp_path), "SECRET_KEY", "DEBUG")
    assert kept == {"SECRET_KEY": "kept-in-the-data-directory-" + "x" * 40, "DEBUG": False}
    # The environment's key wins over the kept one.
    assert settings_values(environment(tmp_path, SECRET_KEY="from-the-environment"), "SECRET_KEY") == {
        "SECRET_KEY": "from-the-environment"}


def test_make_keeps_both_keys_the_demo_needs_and_the_settings_read_them(tmp_path):
    """`make demo` (its secret-key target) keeps SECRET_KEY and STUDIO_SECRETS_KEY in the data directory: with the
    second, projects can store their endpoints' API keys in the demo, which without it the evals page offered and
    always refused."""
    from cryptography.fernet import Fernet

    def make():
        done = subprocess.run(["make", "-s", "secret-key", f"STUDIO_DATA_DIR={tmp_path}", f"PYTHON={sys.executable}"],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    make()
    kept = {name: (tmp_path / name).read_text().strip() for name in ("secret_key", "secrets_key")}
    assert all((tmp_path / name).stat().st_mode & 0o077 == 0 for name in kept)  # owner-only
    Fernet(kept["secrets_key"])  # a Fernet key, or this raises
    assert settings_values(environment(tmp_path), "SECRET_KEY", "SECRETS_KEY") == {
        "SECRET_KEY": kept["secret_key"], "SECRETS_KEY": kept["secrets_key"]}
    make()  # a later `make demo` keeps them: the stored keys stay readable
    assert {name: (tmp_path / name).read_text().strip() for name in kept} == kept
    # The environment's key wins over the kept one; without either, projects store no keys.
    assert settings_values(environment(tmp_path, STUDIO_SECRETS_KEY="from-the-environment"), "SECRETS_KEY") == {
        "SECRETS_KEY": "from-the-environment"}
    assert settings_values(environment(tmp_path / "elsewhere", SECRET_KEY="k" * 50), "SECRETS_KEY") == {
        "SECRETS_KEY": ""}


def test_importing_the_settings_creates_no_directory(tmp_path):
    data_dir = tmp_path / "not" / "there"
    env = environment(data_dir, SECRET_KEY="k" * 50)
    done = python(env, "import django, studio.settings\ndjango.setup()\nimport studio.wsgi\nimport studio.asgi")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "not").exists()


# --- HTTPS and check --deploy --------------------------------------------------------------------------------


def test_check_deploy_is_clean_with_the_production_variables(tmp_path):
    done = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT,
                          env=environment(tmp_path / "data", **PRODUCTION), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no issues" in done.stdout


def test_studio_https_makes_the_cookies_secure(tmp_path):
    names = ("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT", "SECURE_PROXY_SSL_HEADER",
             "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD")
    assert settings_values(environment(tmp_path, **PRODUCTION), *names) == {
        "SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True, "SECURE_SSL_REDIRECT": True,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"], "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True, "SECURE_HSTS_PRELOAD": True}
    # Plain HTTP (the embedded studio): cookies a browser would still send, and no HSTS.
    plain = settings_values(environment(tmp_path, SECRET_KEY="k" * 50), *names)
    assert plain == {"SESSION_COOKIE_SECURE": False, "CSRF_COOKIE_SECURE": False, "SECURE_SSL_REDIRECT": False,
                     "SECURE_PROXY_SSL_HEADER": None, "SECURE_HSTS_SECONDS": 0,
                     "SECURE_HSTS_INCLUDE_SUBDOMAINS": False, "SECURE_HSTS_PRELOAD": False}


# --- what a debug page or an error report may show -----------------------------------------------------------

DATABASE_URL = "postgres://studio:db-hunter2@db.internal:5432/studio"
REDIS_URL = "redis://:redis-hunter2@redis.internal:6379/0"
SAFE_SETTINGS = """
import json, django
django.setup()
from django.views.debug import get_default_exception_reporter_filter
safe = get_default_exception_reporter_filter().get_safe_settings()
print(json.dumps(safe, default=repr))
"""


def safe_settings(tmp_path) -> tuple[dict, str]:
    done = python(environment(tmp_path, SECRET_KEY="k" * 50, DATABASE_URL=DATABASE_URL, REDIS_URL=REDIS_URL),
                  SAFE_SETTINGS)
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout.splitlines()[-1]
    return json.loads(text), text


def test_error_reports_hide_the_connection_urls(tmp_path):
    safe, _ = safe_settings(tmp_path)
    assert safe["DATABASE_URL"] == safe["REDIS_URL"] == safe["SECRET_KEY"] == "********************"
    assert safe["DATABASES"]["default"]["PASSWORD"] == "********************"


def test_no_setting_in_an_error_report_shows_a_password(tmp_path):
    safe, text = safe_settings(tmp_path)
    leaks = sorted(name for name, value in safe.items() if "hunter2" in json.dumps(value, default=repr))
    assert "hunter2" not in text, f"settings that show a password: {leaks}"


# --- Content-Security-Policy ---------------------------------------------------------------------------------


def csp(response) -> dict[str, list[str]]:
    header = response.get("Content-Security-Policy")
    assert header, f"{response.status_code} without a Content-Security-Policy"
    return {name: values for name, *values in (part.split() for part in header.split(";") if part.strip())}


@pytest.fixture
def pages(project, registry, studio_run):
    run, _ = studio_run
    trajectory = run.trajectories.order_by("seq").first()
    verifier = {"project": project.slug, "kind": "verifier", "slug": "numeric"}
    urls = [
        reverse("runs:home"),  # the landing page: a run is running
        reverse("registry:definition_list", kwargs={"project": project.slug}),
        reverse("registry:definition_create", kwargs={"project": project.slug}),
        reverse("registry:definition_detail", kwargs=verifier),
        reverse("registry:version_detail", kwargs={**verifier, "number": 1}),
        reverse("runs:run_list", kwargs={"project": project.slug}),
        reverse("runs:run_detail", kwargs={"project": project.slug, "run_id": run.pk}),
        reverse("runs:run_compare", kwargs={"project": project.slug}) + f"?run={run.pk}",
        reverse("trajectories:trajectory_list", kwargs={"project": project.slug}),
        reverse("api_tokens"),
        reverse("audit_log", kwargs={"project": project.slug}),
        reverse("trajectories:trajectory_detail", kwargs={"project": project.slug, "trajectory_id": trajectory.pk}),
        reverse("registry:version_edit", kwargs=verifier),
        reverse("task_import:task_upload", kwargs={**verifier, "kind": "task_template", "slug": "add-two"}),
        reverse("runs:run_new", kwargs={"project": project.slug}),
        reverse("authoring:verifier_playground", kwargs={"project": project.slug, "slug": "numeric"}),
        reverse("authoring:template_playground", kwargs={"project": project.slug, "slug": "add-two"}),
    ]
    return urls


def test_every_page_allows_scripts_from_the_studio_only(client, owner, project, pages):
    login_page = client.get(reverse("login"))
    assert login_page.status_code == 200
    assert csp(login_page)["script-src"] == ["'self'"]
    walled = client.get(pages[1])  # a page asked for before logging in: the log-in wall's redirect
    assert walled.status_code == 302 and csp(walled)["script-src"] == ["'self'"]
    client.force_login(owner)
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        policy = csp(response)
        assert policy["script-src"] == ["'self'"], url
        assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"], url
    # Redirects and error pages too.
    missing = client.get(f"/p/{project.slug}/no-such-page/")
    assert missing.status_code == 404 and csp(missing)["script-src"] == ["'self'"]
    token, _ = api_token_create(user=owner, name="ci", project=project)
    revoked = client.post(reverse("api_token_revoke", kwargs={"token_id": token.pk}))
    assert revoked.status_code == 302 and csp(revoked)["script-src"] == ["'self'"]


def test_the_explorer_adds_the_hashes_of_dashs_inline_scripts(client, owner, project, studio_run):
    client.force_login(owner)
    page = client.get(reverse("explorer:index", kwargs={"project": project.slug}))
    assert page.status_code == 200
    sources = csp(page)["script-src"]
    assert sources[0] == "'self'"
    hashes = sources[1:]
    assert hashes and all(h.startswith("'sha256-") and h.endswith("'") for h in hashes), sources
    assert "'unsafe-inline'" not in sources and "'unsafe-eval'" not in sources
