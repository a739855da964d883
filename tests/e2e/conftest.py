"""Fixtures for the end-to-end tests that drive a browser: the ASGI server in a thread (HTTP and websockets)
and Playwright driving Debian's Chromium (never a downloaded browser). Mark such tests `browser`.

The server runs in this process so that, with the in-memory channel layer, what a test writes as a worker
reaches the page exactly as in the embedded studio; with REDIS_URL it goes through Redis.
"""

import os

import pytest
from django.conf import settings

from tests.support import ROOT
from tests.support.resources import CHROMIUM, require

# Playwright's sync API runs an event loop in this thread; the tests still call the ORM from it.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

ARTIFACTS = ROOT / "test-artifacts" / "ui"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    require("browser")
    return {**browser_type_launch_args, "executable_path": CHROMIUM,
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--no-first-run"]}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1360, "height": 900}}


@pytest.fixture(scope="session")
def asgi_server():
    from benchmarks.studio.asgi_thread import ThreadedServer

    server = ThreadedServer()
    url = server.start()
    yield url
    server.stop()


@pytest.fixture
def live_url(transactional_db, asgi_server):
    """The server's base URL; the test's writes are committed, so the server's threads see them."""
    return asgi_server


@pytest.fixture
def page_as(live_url, context, session_cookie):
    """page_as(user) -> a Playwright page whose browser is logged in as `user`."""

    def make(user):
        context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session_cookie(user), "url": live_url}])
        page = context.new_page()
        page.set_default_timeout(10_000)
        return page

    return make


@pytest.fixture
def screenshot():
    def save(page, name: str):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        # The run page draws a chart only once it is in view: scroll the page through once so the whole-page
        # picture shows every chart as a reader scrolling down would see it.
        height = page.evaluate("document.documentElement.scrollHeight")
        for top in range(0, height, 600):
            page.evaluate(f"window.scrollTo(0, {top})")
            page.wait_for_timeout(60)
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    return save
