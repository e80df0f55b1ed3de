"""``billing serve``: check the address, migrate, refuse a public port without tokens, serve."""

from __future__ import annotations

import errno
import gc
import ipaddress
import socket
import sys
from typing import Annotated, Any

import typer
import uvicorn
from sqlalchemy.orm import configure_mappers

from billing.auth.tokens import token_count
from billing.cli.common import (
    fail,
    load_settings,
    log_config,
    migrate_or_fail,
    open_sessions,
    safe_url,
)
from billing.storage.db import read_transaction


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback name or address (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback  # serve takes the brackets off
    except ValueError:
        return False


def _authority(host: str, port: int) -> str:
    """``host:port`` as a URL writes it (an IPv6 address in brackets)."""
    try:
        ipv6 = ipaddress.ip_address(host).version == 6
    except ValueError:
        ipv6 = False
    return f"[{host}]:{port}" if ipv6 else f"{host}:{port}"


def _cannot_listen(host: str, port: int, dual_stack: bool = False) -> str | None:
    """Why ``host``:``port`` cannot be listened on now, as one sentence, or None when it can.

    Every address ``host`` resolves to is bound and released at once, with ``SO_REUSEADDR`` as
    uvicorn binds, so ``billing serve`` says so in one line before it migrates or announces
    itself (uvicorn would report it after its startup). A port in use gets a hint; other errors
    are the operating system's words. ``dual_stack``: an IPv6 socket also takes IPv4, as uvicorn
    binds with more than one worker (with one, asyncio binds IPv6 only).
    """
    where = _authority(host, port)
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, UnicodeError) as error:
        return f"cannot listen on {where}: cannot resolve {host!r} ({error})"
    for family, kind, proto, _name, address in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
            try:
                sock.bind(address)
            except OSError as error:
                reason = error.strerror or str(error)
                if error.errno == errno.EADDRINUSE:
                    return (
                        f"cannot listen on {where}: {reason} (another server holds the port? "
                        "choose another with --port)"
                    )
                return f"cannot listen on {where}: {reason}"
    return None


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 8000,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes.")] = 1,
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            help="Trust X-Forwarded-Proto/-For from these proxy addresses (comma-separated, or "
            "'*'): the client's scheme and address (default: BILLING_FORWARDED_ALLOW_IPS; "
            "none trusted)."
        ),
    ] = None,
) -> None:
    """Apply migrations, then serve the HTTP API with uvicorn (reconciling in the background)."""
    settings = load_settings()
    trusted = forwarded_allow_ips or settings.forwarded_allow_ips
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address as a URL writes it
        host = host[1:-1]
    reason = _cannot_listen(host, port, dual_stack=workers > 1)
    if reason is not None:
        fail(reason)
    migrate_or_fail(settings)
    with read_transaction(open_sessions(settings)) as session:
        tokens = token_count(session)
    if tokens == 0:
        if not _is_loopback(host):
            fail(
                f"refusing to listen on {host} without API tokens: create one with "
                "`billing tokens create --role admin`, or listen on 127.0.0.1"
            )
        typer.echo(
            "billing: no API tokens configured: serving UNAUTHENTICATED on loopback only "
            "(create one with `billing tokens create --role admin`)",
            err=True,
        )
    where = _authority(host, port)
    typer.echo(
        f"billing: serving on http://{where} with database {safe_url(settings.database_url)}",
        err=True,
    )
    uvicorn.run(
        "billing.cli.serve:server_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        **uvicorn_options(
            settings.log_level, settings.keep_alive_s, settings.max_header_bytes, trusted
        ),
    )


#: The GIL switch interval of a ``billing serve`` process, in seconds (Python's default: 0.005).
SWITCH_INTERVAL_S = 0.0001


def server_app() -> object:
    """The ASGI app of ``billing serve`` (``billing.server.asgi:app``), loaded in each worker, in a
    process set up by ``serving_process``."""
    from billing.server.asgi import app as server

    serving_process()
    return server


def serving_process() -> None:
    """Set up the current process as ``billing serve`` runs its app (``server_app``; the benches
    that serve an app in-process call it once the app is built, so that they measure the same).

    The heap built at start (modules, the app, validators: hundreds of thousands of objects that
    live as long as the process) is moved out of the cyclic garbage collector's reach with
    ``gc.freeze()``: otherwise every full collection walks it again, a pause (≈ 90 ms of CPU)
    that lands in the acknowledgement latency of ingest under load and in every tenth or so
    request of a page that builds many objects. The ORM's mappers are configured first, so that
    what they build is frozen too.

    The interpreter's switch interval is lowered to ``SWITCH_INTERVAL_S``: the ingest writer
    thread hands the GIL over while SQLite runs each statement and its commit, and when one ends
    it waits for the GIL until the event loop's thread, busy validating posts, is asked to let go
    (after the switch interval, 5 ms by default); a shorter interval gives it back sooner
    (bench/README.md has the measurements).
    """
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # The ORM's mappers are configured on their first use (20-40 ms: every mapped attribute
    # of every table), else by whichever request or reconciliation step comes first.
    configure_mappers()
    gc.collect()
    gc.freeze()


def uvicorn_options(
    log_level: str,
    keep_alive_s: float = 5.0,
    max_header_bytes: int = 32 * 1024,
    forwarded_allow_ips: str | None = None,
) -> dict[str, Any]:
    """The uvicorn settings of ``billing serve`` (also used by bench/ingest.py's HTTP ceiling).

    uvloop and httptools when installed (``uvicorn[standard]`` brings both), with the connection
    limits of ``billing.api.limits.BoundedHttpToolsProtocol`` (header size and deadline; h11
    without httptools, with its own limit of the headers' size), idle connections closed after
    ``keep_alive_s``; no access log, no ``Server`` header; proxy headers (uvicorn's own
    ``proxy_headers``: the scheme and client of ``X-Forwarded-Proto``/``-For``) only from the
    addresses of ``forwarded_allow_ips``, and none without it.
    """
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:  # pragma: no cover - uvicorn[standard] ships it
        loop = "asyncio"
    extra: dict[str, Any] = {}
    http: Any
    try:
        import httptools  # noqa: F401

        from billing.api.limits import BoundedHttpToolsProtocol

        http = BoundedHttpToolsProtocol
    except ImportError:  # pragma: no cover
        http = "h11"
        extra["h11_max_incomplete_event_size"] = max_header_bytes
    return {
        **extra,
        "timeout_keep_alive": keep_alive_s,
        "log_level": log_level,
        "log_config": log_config(log_level),
        "access_log": False,
        "proxy_headers": forwarded_allow_ips is not None,
        "forwarded_allow_ips": forwarded_allow_ips,
        "server_header": False,
        "loop": loop,
        "http": http,
    }
