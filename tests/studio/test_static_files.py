"""/static/ serves the files in static/ and nothing else: a path that climbs out of it (plainly or percent-encoded)
is a 404, for anyone, signed in or not."""

import pytest
from django.test import Client

PROBES = [
    "/static/../../studio/settings.py",
    "/static/../studio/settings.py",
    "/static/%2e%2e/%2e%2e/etc/passwd",
    "/static/%2e%2e/studio/settings.py",
    "/static/..%2f..%2fetc/passwd",
    "/static/..%2fstudio%2fsettings.py",
    "/static/css/../../studio/settings.py",
    "/static/%2fetc%2fpasswd",
    "/static//etc/passwd",
    "/static/css/studio.css/../../../manage.py",
]


@pytest.mark.parametrize("path", PROBES)
def test_a_path_out_of_static_is_404(db, owner, path):
    signed_in = Client()
    signed_in.force_login(owner)
    for client in (Client(), signed_in):
        response = client.get(path)
        body = b"".join(response.streaming_content) if response.streaming else response.content
        assert response.status_code == 404, (path, response.status_code)
        assert b"SECRET_KEY" not in body and b"root:" not in body and b"execute_from_command_line" not in body


def test_a_file_in_static_is_served(db):
    response = Client().get("/static/css/studio.css")
    assert response.status_code == 200
    assert b"".join(response.streaming_content)
