"""Where a request a user aimed may go: the egress policy of the studio's workers.

An eval endpoint's base URL and a run's inference servers are typed by editors, and the workers send requests
there and keep the answers; pointed at the loopback, the cloud's metadata service (169.254.169.254) or a private
service, the studio would read internal services for them (server-side request forgery). So by default only
public addresses are reached: loopback, link-local, private, shared (CGNAT), multicast, unspecified and reserved
ranges are refused unless the operator allows them (STUDIO_EGRESS_ALLOW: host names and CIDRs, e.g.
`127.0.0.0/8 ::1 localhost vllm.internal`).

The check is made on the address actually connected to: `egress_transport` resolves the host once, checks every
address it got, and connects to a checked one (a DNS name that answers a public address to the check and the
loopback to the connection — DNS rebinding — has nothing to swap); every connection of a client goes through it,
so a redirect to a refused address is refused when it connects. Operator-set URLs (the judge, the object store)
are the operator's business and do not go through here.

Hand-written on the standard library's `ipaddress` rather than taken from a package: the SSRF guards on the
package index are either built for `requests` and unmaintained (advocate, 2020) or 0.x releases of one author,
too young to trust with the one check between an editor and the workers' network; the rule itself is a few
lines, and the connection is httpx's own (a network backend of httpcore's that connects to the checked address,
TLS still verified against the URL's host name).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpcore2
import httpx2

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW_SETTING = "STUDIO_EGRESS_ALLOW"


class EgressRefused(ValueError):
    """A request refused by the egress policy, saying where it would have gone and how the operator allows it."""


def _kind(address: Address) -> str:
    """Why an address is not public, in the words of its range."""
    for name, words in (("loopback", "a loopback"), ("link_local", "a link-local"), ("multicast", "a multicast"),
                        ("unspecified", "an unspecified"), ("reserved", "a reserved"), ("private", "a private")):
        if getattr(address, f"is_{name}"):
            return words
    return "a special-purpose (not public)"


@dataclass(frozen=True)
class EgressPolicy:
    """Public addresses, and the hosts and networks the operator allowed."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, text: str) -> EgressPolicy:
        """`text` as STUDIO_EGRESS_ALLOW takes it: host names and CIDRs (or single addresses), separated by spaces
        or commas. ValueError naming an entry that is neither."""
        hosts, networks = set(), []
        for entry in text.replace(",", " ").split():
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            name = entry.lower().rstrip(".")
            if not name or not all(part and len(part) < 64 and part.replace("-", "").replace("_", "").isalnum()
                                   for part in name.split(".")):
                raise ValueError(f"{ALLOW_SETTING}: {entry!r} is neither a host name nor a CIDR (e.g. 10.0.0.0/8)")
            hosts.add(name)
        return cls(frozenset(hosts), tuple(networks))

    def _listed(self, host: str, address: Address) -> bool:
        return host.lower().rstrip(".") in self.hosts or any(address in network for network in self.networks)

    def refusal(self, host: str, address: Address, *, listed_only: bool = False) -> str:
        """Why `address` (what `host` resolved to) may not be connected to; empty when it may."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # ::ffff:127.0.0.1 is the loopback
        if self._listed(host, address):
            return ""
        if listed_only:
            return f"{host} ({address}) is not in {ALLOW_SETTING}"
        if address.is_global and not address.is_multicast:
            return ""
        where = f"{host} is" if host.strip("[]") == str(address) else f"{host} resolves to {address},"
        return (f"{where} {_kind(address)} address: only public addresses are reached unless the operator allows "
                f"it in {ALLOW_SETTING}")

    def admission(self, host: str, address: Address) -> str:
        """Which rule lets `address` (what `host` resolved to) through, in words, for an address `refusal` passed:
        what an editor is told, since the operator's list may admit what public-only would refuse."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if host.lower().rstrip(".") in self.hosts:
            return f"{host} is listed in {ALLOW_SETTING}"
        network = next((network for network in self.networks if address in network), None)
        if network is None:
            return f"{address} is a public address"
        kind = "a public" if address.is_global and not address.is_multicast else _kind(address)
        return f"{address} is {kind} address, admitted by {network} in {ALLOW_SETTING}"

    def addresses(self, host: str, port: int, *, listed_only: bool = False) -> list[Address]:
        """Every address `host` resolves to, each one allowed (EgressRefused otherwise): what a connection may
        use. A name answering one refused address among allowed ones is refused whole."""
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise EgressRefused(f"{host} does not resolve: {exc}") from None
        addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in found))
        for address in addresses:
            problem = self.refusal(host, address, listed_only=listed_only)
            if problem:
                raise EgressRefused(problem)
        if not addresses:
            raise EgressRefused(f"{host} resolves to no address")
        return addresses

    def check_url(self, url: str, *, listed_only: bool = False) -> str:
        """EgressRefused unless `url` is an http(s) URL whose host resolves to allowed addresses only (with
        `listed_only`, addresses or a host name the operator listed: public is not enough); else which rules
        admitted it (`admission`)."""
        try:
            parts = urlsplit(url)
        except ValueError:  # an unbalanced "[" or "]": urllib takes it for a broken IPv6 literal
            raise EgressRefused(f"{url!r} is not a valid URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EgressRefused(f"{url!r} is not an http(s) URL with a host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise EgressRefused(f"{url!r} has a port that is not a number from 0 to 65535") from None
        if parts.hostname.rstrip(".") in self.hosts:
            # a name the operator listed: what it resolves to is theirs (and it may not be up yet)
            return f"{parts.hostname} is listed in {ALLOW_SETTING}"
        return "; ".join(dict.fromkeys(self.admission(parts.hostname, address) for address in
                                       self.addresses(parts.hostname, port, listed_only=listed_only)))


PUBLIC_ONLY = EgressPolicy()


class _CheckedBackend(httpcore2.SyncBackend):
    """httpcore's TCP connect, to an address of the host the policy allowed (resolved here, once)."""

    def __init__(self, policy: EgressPolicy, listed_only: bool):
        self.policy, self.listed_only = policy, listed_only

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        address = self.policy.addresses(host, port, listed_only=self.listed_only)[0]
        return super().connect_tcp(str(address), port, timeout=timeout, local_address=local_address,
                                   socket_options=socket_options)


class EgressTransport(httpx2.HTTPTransport):
    """httpx's transport whose every connection goes to an address the policy allowed. No proxy: the client that
    takes it must not add the environment's (trust_env=False), or the proxy would connect for it."""

    def __init__(self, policy: EgressPolicy, *, listed_only: bool = False, limits: httpx2.Limits | None = None):
        limits = limits or httpx2.Limits(max_connections=100, max_keepalive_connections=20)
        super().__init__(limits=limits)
        # httpx builds its connection pool without a way to pass a network backend: the same pool, with ours.
        self._pool = httpcore2.ConnectionPool(
            ssl_context=httpx2.create_ssl_context(), max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            network_backend=_CheckedBackend(policy, listed_only))


def egress_client(policy: EgressPolicy, *, listed_only: bool = False, max_connections: int = 100,
                  **options) -> httpx2.Client:
    """An httpx client that reaches only what `policy` allows; `options` as httpx.Client takes them."""
    limits = httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx2.Client(transport=EgressTransport(policy, listed_only=listed_only, limits=limits), trust_env=False,
                         **options)


def refused_cause(exc: BaseException) -> EgressRefused | None:
    """The egress refusal behind an HTTP client's error (httpx and openai wrap what the transport raised)."""
    while exc is not None:
        if isinstance(exc, EgressRefused):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
