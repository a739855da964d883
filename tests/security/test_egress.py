"""The egress policy (workers/egress.py), rule by rule: what a request a user aimed may reach, checked on the
address actually connected to. No Django: the engine's side of the policy."""

import socket

import pytest

from tests.support.recording_server import RecordingServer
from workers.egress import EgressPolicy, EgressRefused, egress_client
from workers.rl.engines import GenerationRequest
from workers.rl.engines.endpoint import EndpointEngine
from workers.rl.engines.server import ServerEngine

PUBLIC = EgressPolicy()


@pytest.mark.parametrize(("url", "words"), [
    ("http://127.0.0.1:8000/v1", "loopback"),
    ("http://localhost:8000/v1", "localhost resolves to 127.0.0.1, a loopback"),  # a DNS name for the loopback
    ("http://2130706433/v1", "resolves to 127.0.0.1"),  # the loopback as one decimal number
    ("http://[::1]:8000/v1", "loopback"),
    ("http://[::ffff:127.0.0.1]/v1", "loopback"),  # IPv4-mapped IPv6
    ("http://169.254.169.254/latest/meta-data/", "link-local"),  # the cloud's metadata service
    ("http://10.0.0.5/v1", "private"),
    ("http://172.16.0.1/v1", "private"),
    ("http://192.168.1.1/v1", "private"),
    ("http://[fd00::1]/v1", "private"),
    ("http://100.64.0.1/v1", "not public"),  # shared address space (CGNAT)
    ("http://224.0.0.1/v1", "multicast"),
    ("http://0.0.0.0:8000/v1", "unspecified"),
    ("http://240.0.0.1/v1", "reserved"),
])
def test_only_public_addresses_are_reached_by_default(url, words):
    with pytest.raises(EgressRefused, match=words) as refused:
        PUBLIC.check_url(url)
    assert "STUDIO_EGRESS_ALLOW" in str(refused.value)  # the refusal says how the operator allows it


def test_a_public_address_passes_and_what_is_not_an_http_url_does_not():
    PUBLIC.check_url("http://93.184.215.14/v1")
    PUBLIC.check_url("https://[2606:4700::1111]/v1")
    for url in ("ftp://93.184.215.14/", "file:///etc/passwd", "http:///v1", "http://93.184.215.14:99999/",
                "https://āã]", "http://[::1/v1"):
        with pytest.raises(EgressRefused):
            PUBLIC.check_url(url)


def test_the_operator_allows_hosts_and_networks_and_nothing_else():
    policy = EgressPolicy.parse("127.0.0.0/8, ::1 vllm.internal 10.1.0.0/16")
    policy.check_url("http://127.0.0.1:8000/v1")
    policy.check_url("http://localhost:8000/v1")  # resolves into an allowed network
    policy.check_url("http://[::1]/v1")
    policy.check_url("http://10.1.2.3/v1")
    policy.check_url("http://vllm.internal:8000/v1")  # a listed name, whatever it resolves to
    with pytest.raises(EgressRefused, match="private"):
        policy.check_url("http://10.2.0.1/v1")
    with pytest.raises(EgressRefused, match="link-local"):
        policy.check_url("http://169.254.169.254/")
    with pytest.raises(ValueError, match="neither a host name nor a CIDR"):
        EgressPolicy.parse("10.0.0.0/8 http://x/")


def test_inference_servers_must_be_listed_public_is_not_enough():
    listed = EgressPolicy.parse("203.0.113.7")
    listed.check_url("http://203.0.113.7:8000/v1", listed_only=True)
    with pytest.raises(EgressRefused, match="not in STUDIO_EGRESS_ALLOW"):
        listed.check_url("http://93.184.215.14:8000/v1", listed_only=True)
    with pytest.raises(EgressRefused, match="inference server http://127.0.0.1:9/v1"):
        ServerEngine(["http://127.0.0.1:9/v1"], token="weights-token")  # the default policy lists nothing


def test_a_refused_address_is_never_connected_to():
    with RecordingServer() as server:
        with pytest.raises(EgressRefused):
            EndpointEngine(base_url=server.url + "/v1", model="m")  # refused before any request
        with egress_client(PUBLIC) as client, pytest.raises(EgressRefused):
            client.post(server.url + "/v1/chat/completions", json={})
    assert server.requests == []


def test_a_redirect_to_a_refused_address_is_not_followed():
    """127.0.0.1 allowed, 127.0.0.2 not: the allowed server's redirect to the other is refused at its connect."""
    policy = EgressPolicy.parse("127.0.0.1/32")
    with RecordingServer("127.0.0.1") as allowed, RecordingServer("127.0.0.2") as refused:
        with egress_client(policy, follow_redirects=True) as client, pytest.raises(EgressRefused, match="127.0.0.2"):
            client.post(f"{allowed.url}/moved/?to={refused.url}/v1/chat/completions", json={})
        engine = EndpointEngine(base_url=f"{allowed.url}/moved/?to={refused.url}/v1", model="m", egress=policy,
                                client_retries=0, retries=0)
        try:
            [[answer]] = engine.generate([_request()])
        finally:
            engine.close()
    assert answer.finish_reason == "error" and "EgressRefused" in answer.error and "127.0.0.2" in answer.error
    assert len(allowed.requests) == 2 and refused.requests == []


def test_the_address_checked_is_the_address_connected_to(monkeypatch):
    """DNS rebinding: a name that answers a public address when the engine is built and the loopback when it
    connects is refused at the connection, and the loopback server gets nothing."""
    real = socket.getaddrinfo
    answers = iter(["93.184.215.14", "127.0.0.1", "127.0.0.1", "127.0.0.1"])

    def rebinding(host, port, *args, **kwargs):
        if host == "rebind.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    with RecordingServer() as server:
        port = server.url.rsplit(":", 1)[1]
        engine = EndpointEngine(base_url=f"http://rebind.example:{port}/v1", model="m", client_retries=0, retries=0)
        try:
            [[answer]] = engine.generate([_request()])
        finally:
            engine.close()
    assert answer.finish_reason == "error" and "loopback" in answer.error
    assert server.requests == []


def _request() -> GenerationRequest:
    return GenerationRequest(prompt_ids=[], n=1, max_new_tokens=4, stop_ids=(),
                             messages=({"role": "user", "content": "2 + 2?"},))
