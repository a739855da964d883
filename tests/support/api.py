"""The REST API as a token holder calls it: JSON to /api/v1 with `Authorization: Bearer <token>` (the `api_as`
fixture, tests/conftest.py, makes one with a real token, made the way users make theirs)."""

import json

PREFIX = "/api/v1"


class ApiClient:
    """Django's test client speaking JSON to /api/v1 as one token holder."""

    def __init__(self, client, token: str | None):
        self.client = client
        self.headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}

    def get(self, path: str, **query):
        return self.client.get(PREFIX + path, query, **self.headers)

    def post(self, path: str, body):
        return self._send("post", path, body)

    def put(self, path: str, body):
        return self._send("put", path, body)

    def patch(self, path: str, body):
        return self._send("patch", path, body)

    def _send(self, method: str, path: str, body):
        data = body if isinstance(body, (str, bytes)) else json.dumps(body)
        return getattr(self.client, method)(PREFIX + path, data, content_type="application/json", **self.headers)
