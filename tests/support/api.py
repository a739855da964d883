"""Fixtures for the REST API: a client that sends a real API token, made the way users make theirs."""

import json

import pytest

from apps.accounts.services import api_token_create

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

    def _send(self, method: str, path: str, body):
        data = body if isinstance(body, (str, bytes)) else json.dumps(body)
        return getattr(self.client, method)(PREFIX + path, data, content_type="application/json", **self.headers)


@pytest.fixture
def token_for(db):
    """token_for(user) -> a plaintext API token of user."""

    def make(user) -> str:
        return api_token_create(user=user, name="tests", via="api")[1]

    return make


@pytest.fixture
def api_as(client, token_for):
    """api_as(user) -> an ApiClient authenticated with a fresh token of user; api_as(None) sends no token."""

    def make(user) -> ApiClient:
        return ApiClient(client, token_for(user) if user is not None else None)

    return make

