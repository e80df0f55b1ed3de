"""Where this service may send a request of its own (a budget's webhook): the destination
policy, stated once.

A destination is an ``https`` or ``http`` URL with a host and no credentials. Its host must not
be an address of this machine or its network: loopback, private, link-local (cloud metadata
services such as ``169.254.169.254`` and ``fd00:ec2::254``), shared (CGNAT, Alibaba's metadata
``100.100.100.200``), multicast, reserved or unspecified (every range that is not globally
reachable by ``ipaddress``'s ``is_global``), in any spelling a resolver accepts (``127.1``,
``0x7f000001``, ``2130706433``, ``017700000001``, ``[::ffff:127.0.0.1]``, ``0.0.0.0``).

``check_url`` applies the policy to a URL's text (at a budget's create and update: a literal
address is refused there); ``checked_addresses`` applies it again at send time to the addresses a
name resolves to (``resolve``), so a name that resolves to a private address (DNS rebinding) is
refused before any connection is made, and the connection goes to the address checked.

With ``BILLING_WEBHOOK_ALLOW_PRIVATE=true`` (``allowing_private``) private destinations are
allowed (a receiver on the same host or network; the tests' receivers on 127.0.0.1); the scheme
and the no-credentials rules hold either way.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

SCHEMES = ("https", "http")
#: Whether private destinations are allowed where the policy is applied now (the server sets it
#: from ``Settings.webhook_allow_private`` for each request and for its delivery worker).
_ALLOW_PRIVATE: ContextVar[bool] = ContextVar("allow_private_destinations", default=False)


class RefusedDestination(ValueError):
    """A destination the policy refuses; ``str()`` says why, without any response detail."""


@contextmanager
def allowing_private(allow: bool) -> Iterator[None]:
    """Apply the policy with private destinations allowed (or not) within the block."""
    token = _ALLOW_PRIVATE.set(allow)
    try:
        yield
    finally:
        _ALLOW_PRIVATE.reset(token)


def private_allowed() -> bool:
    return _ALLOW_PRIVATE.get()


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` spells, in any form a resolver takes as an address (IPv6, dotted
    quad, and the legacy ``inet_aton`` forms: ``127.1``, ``0x7f000001``, ``2130706433``,
    ``017700000001``); None for a name."""
    text = host.strip("[]")
    try:
        return ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except (OSError, ValueError):
        return None


def is_public(address: IPAddress) -> bool:
    """Whether ``address`` is globally reachable and unicast (an IPv4-mapped or NAT64 IPv6
    address is judged by its IPv4 address)."""
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            return is_public(mapped)
        if address in _NAT64:
            return is_public(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return address.is_global and not address.is_multicast


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def check_address(address: IPAddress) -> None:
    """``RefusedDestination`` when the policy refuses ``address``."""
    if not private_allowed() and not is_public(address):
        raise RefusedDestination(
            "must not name a loopback, private, link-local, metadata or multicast address"
        )


def check_url(url: str) -> None:
    """``RefusedDestination`` unless ``url`` is an allowed destination's URL (see the module)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 (a port out of range raises here)
    except ValueError:
        raise RefusedDestination("is not a valid URL") from None
    if parts.scheme not in SCHEMES:
        raise RefusedDestination("must be an https:// or http:// URL")
    if not host:
        raise RefusedDestination("must name a host")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise RefusedDestination("must not carry credentials (user:password@)")
    address = literal_address(host)
    if address is not None:
        check_address(address)


async def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (the system resolver, in a thread)."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return [str(info[4][0]) for info in infos]


async def checked_addresses(host: str, port: int) -> list[str]:
    """The addresses to connect to for ``host``: the literal address, or every address the name
    resolves to; ``RefusedDestination`` when any of them is refused (nothing is connected)."""
    literal = literal_address(host)
    texts = [str(literal)] if literal is not None else await resolve(host, port)
    if not texts:
        raise RefusedDestination("resolves to no address")
    for text in texts:
        check_address(ipaddress.ip_address(text.partition("%")[0]))
    return texts
