"""The real resources a test may need, one marker each (registered in pyproject.toml), and the one rule for
when one is missing: the test is skipped with the reason — or, when STUDIO_REQUIRE names the resource (or is
"all", as in CI), it fails with that reason, so a machine that lost a service cannot pass by skipping.

tests/conftest.py applies the rule to every test's markers before its fixtures are set up; a fixture that needs
a resource calls `require` itself, so the same rule holds whoever uses it. Each resource is probed once per
session.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"


def _sandbox() -> str | None:
    if shutil.which("bwrap") is None:
        return "needs bubblewrap: it is not installed (make setup installs it as root: apt-get install bubblewrap)"
    probe = subprocess.run(["bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/usr", "/usr", "--symlink",
                            "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib", "/usr/bin/true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"needs bubblewrap: it cannot create namespaces here: {probe.stderr.strip() or probe.returncode}"
    return None


def _postgres() -> str | None:
    from django.db import connection

    if connection.vendor != "postgresql":
        return "needs PostgreSQL: set DATABASE_URL=postgres://... (CI does)"
    return None


def _redis() -> str | None:
    from django.conf import settings

    if not settings.REDIS_URL:
        return "needs Redis: set REDIS_URL=redis://... (CI does)"
    import redis

    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        return f"needs Redis: nothing answers at REDIS_URL={settings.REDIS_URL}: {exc}"
    return None


def _docker() -> str | None:
    try:
        import docker

        docker.from_env().ping()
    except Exception as exc:
        where = os.environ.get("DOCKER_HOST") or "its default socket"
        return f"needs a Docker engine (DOCKER_HOST; .ci/run starts one): none answers at {where}: {type(exc).__name__}"
    return None


def _browser() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"needs a browser: Debian's Chromium at {CHROMIUM} (make setup installs it as root)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"needs a browser: Playwright does not import ({exc}; make setup installs it)"
    return None


def _processes() -> str | None:
    from django.db import connection

    if connection.vendor != "postgresql":
        return "needs studio processes of its own: they share the test database only on PostgreSQL"
    return None


def _servers() -> str | None:
    from tests.support.servers import postgres_bin

    if os.geteuid() != 0:
        return "needs root: the fault tests run PostgreSQL as its own user and mount a small file system"
    if postgres_bin() is None:
        return "needs PostgreSQL's server programs (initdb, pg_ctl: Debian's postgresql package)"
    if shutil.which("redis-server") is None:
        return "needs redis-server (Debian's redis-server package)"
    return None


def _s3() -> str | None:
    from tests.support.object_store import s3_endpoint

    try:
        s3_endpoint()
    except RuntimeError as exc:
        return f"needs an S3-compatible server: {exc}"
    return None


def _compose() -> str | None:
    if compose_command() is None:
        return "needs Docker Compose (`docker compose` or Debian's docker-compose; .ci/run installs it)"
    return None


def compose_command() -> list[str] | None:
    """`docker compose` (the v2 plugin) where it is installed, else Debian's `docker-compose`, else None."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


IDP_DIR = Path(__file__).resolve().parent / "idp"


def _idp() -> str | None:
    if shutil.which("node") is None:
        return "needs Node to run the test identity providers (make setup installs Debian's nodejs as root)"
    if not (IDP_DIR / "node_modules" / ".installed").is_file():
        return f"needs the test identity providers' npm packages in {IDP_DIR}/node_modules (make setup: npm ci)"
    return None


def _saml_idp() -> str | None:
    if shutil.which("xmlsec1") is None:
        return ("needs Debian's xmlsec1, with which the test SAML identity provider (pysaml2) signs (make setup "
                "installs it as root)")
    return None


# name -> probe: None when the resource is there, else the reason a test that needs it cannot run.
PROBES = {"sandbox": _sandbox, "postgres": _postgres, "redis": _redis, "docker": _docker, "browser": _browser,
          "processes": _processes, "servers": _servers, "s3": _s3, "compose": _compose,
          "idp": _idp, "saml_idp": _saml_idp}


@functools.cache
def missing(resource: str) -> str | None:
    """Why `resource` is not available here, or None; probed once per session."""
    return PROBES[resource]()


def required() -> set[str]:
    """The resources STUDIO_REQUIRE makes mandatory: "all", or a comma-separated list of names."""
    names = {name.strip() for name in os.environ.get("STUDIO_REQUIRE", "").split(",") if name.strip()}
    if "all" in names:
        return set(PROBES)
    unknown = names - set(PROBES)
    if unknown:
        raise pytest.UsageError(f"STUDIO_REQUIRE names {', '.join(sorted(unknown))}; known: all, "
                                f"{', '.join(PROBES)}")
    return names


def require(*resources: str) -> None:
    """Skip the current test (or fixture's tests) unless every one of `resources` is available; fail instead
    where STUDIO_REQUIRE requires a missing one. The one place that decides between the two."""
    reasons = {name: reason for name in PROBES if name in resources and (reason := missing(name))}
    if not reasons:
        return
    mandatory = sorted(set(reasons) & required())
    if mandatory:
        pytest.fail("; ".join(reasons.values()) + f" [STUDIO_REQUIRE={os.environ['STUDIO_REQUIRE']} makes "
                    f"{', '.join(mandatory)} mandatory]", pytrace=False)
    # Reported at the test's location (as pytest does for a skip raised in a fixture), not this line's.
    raise pytest.skip.Exception("; ".join(reasons.values()), _use_item_location=True)
