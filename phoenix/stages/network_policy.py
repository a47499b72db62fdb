"""Which addresses the router may fetch a document from: a message names the URL, so by default only public ones.

A URL from a message could otherwise reach what only the pod can: the cloud's metadata service (169.254.169.254),
the pod's own ports, the cluster's services. Loopback, private, link-local, multicast and reserved addresses are
refused unless DOCUMENT_ALLOWED_NETWORKS lists a network holding them; the host of RECORDS_API_URL, which the
stage's configuration names rather than a message, is reached whatever its address.

The check is made on the addresses a name resolves to, by the connector's own resolver (GuardedResolver), so the
connection goes to an address that was checked: a name that resolves to a public address for a check and to a
private one for the connection (DNS rebinding) cannot slip through. aiohttp does not ask the resolver about an
IP-literal host, so the fetcher checks those itself (`refusal`).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressRefusedError(OSError):
    """A host resolves to no address the policy allows. An OSError, so that aiohttp hands it on as the cause of
    its ClientConnectorDNSError (`os_error`) instead of replacing it."""


@dataclass(frozen=True)
class NetworkPolicy:
    allowed_networks: tuple[Network, ...] = ()
    # (host, port) pairs reached whatever their address: the origin of RECORDS_API_URL.
    trusted: frozenset[tuple[str, int]] = field(default_factory=frozenset)

    def trusts(self, host: str, port: int | None) -> bool:
        return (host.rstrip(".").lower(), port or 0) in self.trusted

    def refusal(self, address: str) -> str | None:
        """Why `address` (an IP address, an IPv6 one with or without its %scope) may not be connected to."""
        ip: Address = ipaddress.ip_address(address.partition("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
            ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
        if any(ip in network for network in self.allowed_networks):
            return None
        if ip.is_global and not ip.is_multicast:
            return None
        return f"{ip} is {_kind(ip)} address, refused unless DOCUMENT_ALLOWED_NETWORKS holds it"


def _kind(ip: Address) -> str:
    for kind, yes in (
        ("a loopback", ip.is_loopback),
        ("a link-local", ip.is_link_local),
        ("a multicast", ip.is_multicast),
        ("a private", ip.is_private),
    ):
        if yes:
            return kind
    return "a non-public"


def trusted_origin(url: str | None) -> frozenset[tuple[str, int]]:
    """The (host, port) of a configured URL (RECORDS_API_URL's template), or none."""
    if not url:
        return frozenset()
    parsed = URL(url)
    return frozenset({(parsed.raw_host.rstrip(".").lower(), parsed.port or 0)}) if parsed.raw_host else frozenset()


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, keeping only the addresses the policy allows; none left is an AddressRefusedError."""

    def __init__(self, policy: NetworkPolicy) -> None:
        self._policy = policy
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if self._policy.trusts(host, port):
            return found
        allowed = [result for result in found if self._policy.refusal(result["host"]) is None]
        if not allowed and found:
            raise AddressRefusedError(
                f"{host} resolves to no allowed address: {self._policy.refusal(found[0]['host'])}"
            )
        return allowed

    async def close(self) -> None:
        await self._inner.close()
