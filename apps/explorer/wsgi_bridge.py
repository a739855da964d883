"""Django request in, WSGI app (Dash's Flask server) out, Django response back.

Hand-written because it is twenty lines and keeps Dash inside Django's own request handling: login, project
permissions, sessions and CSRF run first, in the same process and URL space. The adapters on PyPI mount a
WSGI app beside Django (at the ASGI router), where none of that would run.
"""

from __future__ import annotations

import io
import sys

from django.http import HttpResponse


def _environ(request) -> dict:
    body = request.body
    environ = {key: value for key, value in request.META.items() if isinstance(value, str)}
    host = request.get_host()
    environ.update({
        "REQUEST_METHOD": request.method, "SCRIPT_NAME": "", "PATH_INFO": request.path,
        "QUERY_STRING": request.META.get("QUERY_STRING", ""), "CONTENT_LENGTH": str(len(body)),
        "SERVER_NAME": host.rsplit(":", 1)[0], "SERVER_PORT": str(request.get_port()), "HTTP_HOST": host,
        "SERVER_PROTOCOL": request.META.get("SERVER_PROTOCOL", "HTTP/1.1"),
        "wsgi.version": (1, 0), "wsgi.url_scheme": request.scheme, "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
    })
    return environ


def call_wsgi(app, request) -> HttpResponse:
    answer: dict = {}

    def start_response(status, headers, exc_info=None):
        answer["status"], answer["headers"] = status, headers
        return lambda data: None  # the legacy write() callable; Flask never uses it

    result = app(_environ(request), start_response)
    try:
        body = b"".join(result)
    finally:
        if hasattr(result, "close"):
            result.close()
    response = HttpResponse(body, status=int(answer["status"].split(" ", 1)[0]))
    for name, value in answer["headers"]:
        if name.lower() not in ("content-length", "connection"):
            response[name] = value
    return response
