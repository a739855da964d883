"""The studio's own error pages: a 404 and a 500 in the studio's look, each with a way back home.

Django renders the 500 page with an empty context (no request, no user, no context processors), because the
request is what may have failed: the page must stand without any of it."""

from django.test import RequestFactory
from django.views.defaults import server_error


def test_a_server_error_answers_the_studios_own_page_without_a_request_context():
    page = server_error(RequestFactory().get("/p/acme-rl/audit/"))
    body = page.content.decode()
    assert page.status_code == 500
    assert 'href="/static/css/studio.css"' in body and 'class="topnav"' in body
    assert "<h1>Something went wrong</h1>" in body and 'href="/"' in body


def test_an_unknown_address_answers_the_studios_own_page(client, owner):
    client.force_login(owner)
    page = client.get("/no/such/page/")
    body = page.content.decode()
    assert page.status_code == 404
    assert 'href="/static/css/studio.css"' in body and "There is nothing at this address." in body
    assert "Resolver404" not in body and "Back to your projects" in body
