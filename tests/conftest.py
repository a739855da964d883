"""Shared fixtures, and the one rule for tests that need a real resource.

Tests use the real database named by DATABASE_URL (SQLite by default, PostgreSQL in CI). A test that needs
more — bubblewrap sandboxes, PostgreSQL, Redis, a Docker engine, a browser, studio processes of its own — says
so with a marker (pyproject.toml lists them); where the resource is missing it is skipped with the reason, or
fails where STUDIO_REQUIRE asks for it (tests/support/resources.py). Every test's data directory is a fresh
temporary one.
"""

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from apps.accounts.models import TokenScope
from apps.accounts.selectors import project_list_for_user
from apps.accounts.services import api_token_create, membership_set, project_create
from tests.support.api import ApiClient
from tests.support.resources import PROBES, require, required
from tests.support.sandbox import reachable_cache, remove_cache
from tests.support.specimens import DOMAIN_SPEC, IMAGE_SPEC, TEMPLATE_SPEC, VERIFIER_SPEC, addition_instances


def pytest_configure(config):
    required()  # a misspelt STUDIO_REQUIRE is a usage error, not a silently optional resource


def pytest_collection_modifyitems(config, items):
    """The browser tests last, in the order they were collected: once one has run, Playwright's sync API keeps an
    event loop running in the process's main thread for the rest of the session, and async_to_sync and asyncio.run
    refuse to run there (the live-page and environment-server tests use them). Under pytest-xdist (make test) the
    scheduler hands out modules in this order, so a process that has started the browser tests runs only those."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture of the test is set up: the resources its markers name are there, or it is skipped
    (or failed, under STUDIO_REQUIRE) with the reason."""
    resources = dict.fromkeys(marker.name for marker in item.iter_markers() if marker.name in PROBES)
    if resources:
        require(*resources)


# --- every test's data directory is a temporary one ----------------------------------------------------------

def _data_dir_settings(root) -> dict:
    # SECRETS_KEY: none (a test that stores keys sets one), not the one `make demo` may have kept in ./var.
    return {"DATA_DIR": root, "SANDBOX_STATUS_DIR": root / "sandbox-pools", "SECRETS_KEY": ""}


@pytest.fixture(scope="session", autouse=True)
def session_data_dir(tmp_path_factory):
    """For what session- and module-scoped fixtures write (the threaded ASGI server, sandbox pools)."""
    with override_settings(**_data_dir_settings(tmp_path_factory.mktemp("session") / "data")):
        yield django_settings.DATA_DIR


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path, monkeypatch):
    """settings.DATA_DIR (artifacts, checkpoints, models, sandbox pool states) is under this test's tmp_path,
    and so is the STUDIO_DATA_DIR of any process the code under test starts: nothing is written to ./var."""
    for name, value in _data_dir_settings(tmp_path / "data").items():
        setattr(settings, name, value)
    monkeypatch.setenv("STUDIO_DATA_DIR", str(settings.DATA_DIR))
    return settings.DATA_DIR


@pytest.fixture
def object_store(settings, monkeypatch):
    """A bucket of this test's own on the S3-compatible test server (mark the test `s3`; tests/support/
    object_store.py): settings.STORAGE_URL points the studio's blob storage there, and the AWS SDK's variables,
    which any process the test starts inherits, point at the server. Returns the storage URL."""
    from tests.support.object_store import new_bucket, s3_environment

    require("s3")
    for name, value in s3_environment().items():
        monkeypatch.setenv(name, value)
    settings.STORAGE_URL = f"s3://{new_bucket()}/studio"
    return settings.STORAGE_URL


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # Tests create many users; the production hasher is deliberately slow.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# --- people and projects ------------------------------------------------------------------------------------

@pytest.fixture
def make_user(db):
    def make(username: str, password: str = "pw-for-tests"):
        return get_user_model().objects.create_user(username=username, password=password)

    return make


@pytest.fixture
def owner(make_user):
    return make_user("olive")


@pytest.fixture
def project(owner):
    return project_create(team_slug="acme", slug="acme-rl", name="Acme RL", owner=owner)


@pytest.fixture
def member(project, make_user, owner):
    """member("viewer") -> a user holding that role in `project`."""

    def make(role: str):
        user = make_user(f"{role}-user")
        membership_set(project=project, user=user, role=role, actor=owner)
        return user

    return make


@pytest.fixture
def outsider(make_user):
    """Owner of another project, member of none of ours."""
    user = make_user("mallory")
    project_create(team_slug="other", slug="other-team", name="Other", owner=user)
    return user


# --- a small but complete registry: image, verifier, task template with instances, domain, bundle ----------

@pytest.fixture
def registry(project, owner):
    """Publishes one definition of each kind in `project`; returns their versions by kind."""
    from apps.registry.services import version_publish

    def publish(kind, slug, spec, **extra):
        return version_publish(project=project, kind=kind, slug=slug, spec=spec, author=owner, **extra).version

    return {
        "sandbox_image": publish("sandbox_image", "py-basic", IMAGE_SPEC),
        "verifier": publish("verifier", "numeric", VERIFIER_SPEC),
        "task_template": publish("task_template", "add-two", TEMPLATE_SPEC, instances=addition_instances()),
        "domain": publish("domain", "arithmetic", DOMAIN_SPEC, description="Exact-answer arithmetic"),
        "bundle": publish("bundle", "arith-bundle", {"members": ["domain/arithmetic@latest"]}),
    }


# --- clients: a logged-in browser session, an API token holder ----------------------------------------------

@pytest.fixture
def login(client):
    """login(user) -> the test client, logged in as user."""

    def as_user(user):
        client.force_login(user)
        return client

    return as_user


@pytest.fixture
def session_cookie():
    """session_cookie(user) -> the value of a session cookie logged in as user (for a browser or a websocket)."""

    def make(user) -> str:
        client = Client()
        client.force_login(user)
        return client.cookies[django_settings.SESSION_COOKIE_NAME].value

    return make


@pytest.fixture
def token_for(db):
    """token_for(user, project=None, scope="write") -> a plaintext API token of user for `project` (default: the
    first project user is a member of) with `scope` (which caps the user's role there)."""

    def make(user, project=None, scope: str = TokenScope.WRITE, **extra) -> str:
        project = project or project_list_for_user(user=user).order_by("pk").first()
        return api_token_create(user=user, name="tests", project=project, scope=scope, via="api", **extra)[1]

    return make


@pytest.fixture
def api_as(client, token_for):
    """api_as(user, **token) -> an ApiClient authenticated with a fresh token of user (token_for's project and
    scope); api_as(None) sends no token."""

    def make(user, **token) -> ApiClient:
        return ApiClient(client, token_for(user, **token) if user is not None else None)

    return make


# --- a run with history -------------------------------------------------------------------------------------

@pytest.fixture
def studio_run(project, registry, owner):
    """A running run with 30 synthetic steps (metrics, events, trajectories); returns (run, attempt)."""
    from apps.operations.synthetic import run_synthetic_create, run_synthetic_steps

    run = run_synthetic_create(project=project, bundle=registry["bundle"], steps=100, name="live-run", actor=owner)
    attempt = run_synthetic_steps(run=run, steps=30, finish=False)
    run.refresh_from_db()
    return run, attempt


# --- sandboxes ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def layer_cache():
    """A layer cache for this session's sandboxes, where the sandbox uids can reach it."""
    cache = reachable_cache()
    yield cache
    remove_cache(cache)


# --- the egress policy ----------------------------------------------------------------------------------------

LOOPBACK = "127.0.0.0/8 ::1 localhost"


@pytest.fixture
def egress_loopback(settings, monkeypatch):
    """The operator's allowance of this machine's loopback (STUDIO_EGRESS_ALLOW, as the demo sets it), for a test
    whose endpoints or inference servers are servers it starts here; any process the test starts inherits it.
    Without it, the loopback is refused, as in production (tests/security). Returns the policy."""
    from workers.egress import EgressPolicy

    settings.EGRESS_ALLOW = LOOPBACK
    monkeypatch.setenv("STUDIO_EGRESS_ALLOW", LOOPBACK)
    return EgressPolicy.parse(LOOPBACK)
