"""Every request bounded before it costs anything: the limits of the service, in one place.

Two layers, each refusing as early as the request can be judged:

- **The connection** (``BoundedHttpToolsProtocol``, the HTTP protocol of ``billing serve``):
  uvicorn's httptools parser takes headers of any size (a 128 MiB header costs seconds of CPU
  and its memory), and a connection that sends nothing, or half a request line, is held for
  ever. Here the request line and headers together are limited to ``max_header_bytes`` (431),
  a request pipelined behind another in the same read included (the parser is given one head
  or one body at a time, counted before it sees them), and must arrive within
  ``header_timeout_s`` of the connection opening or the request starting
  (408, then the connection is closed; a connection that sent nothing is just closed). Idle
  connections between requests are closed after ``keep_alive_s`` (uvicorn's keep-alive timeout).
- **The request** (``RequestLimits``, pure ASGI, in front of every route, the fast ingest route
  too), in this order:

  1. In open mode (no API token exists yet) only a loopback ``Host`` is served: ``localhost``,
     ``127.0.0.1`` or ``[::1]``, with any port (400): a web page in the operator's browser must
     not reach the service under another name (DNS rebinding).
  2. A ``POST`` (``PUT``, ``PATCH``) must say ``Content-Type: application/json`` (415): a page
     can make a browser send ``text/plain`` or a form anywhere without asking, never JSON.
     ``Content-Encoding`` may be ``gzip`` on ``POST /v1/events`` only (415 otherwise). The
     console's two HTML forms (``form_paths``: sign-in and sign-out) are the one exception: a
     form without script can only send ``application/x-www-form-urlencoded``, so they take
     that, and only that, within their own small limit and without a bearer token (the form
     carries the token; the console refuses a cross-origin post, ``billing.console.access``).
  3. Once a token exists, a request with a body must carry a valid bearer token before a byte
     of the body is read (401); the route's guard then checks the role (403).
  4. The body: refused at once when its ``Content-Length`` is over the route's limit (1 MiB on
     ``POST /v1/events``, ``max_body_bytes`` elsewhere), or as soon as what arrives passes it
     (413); it must arrive in full within ``body_timeout_s`` (408). A gzip body of
     ``POST /v1/events`` is inflated here, at most to the 1 MiB limit and at most
     ``MAX_GZIP_RATIO`` times its compressed size (413); a body that is not valid gzip is 400.

  An answer given before the body was read closes the connection (the rest is not read). The
  route gets the (inflated) body at once, read once, here: ``admitted_body(request)`` (and
  ``receive`` gives it again to a route that reads its stream); the role of an admitted token
  goes in the scope too, for the route's guard (``billing.auth.guard.ADMITTED_ROLE``). Errors
  come from ``billing.api.errors`` like every other answer. A 422 lists at most 100 problems
  (``billing.errors.ValidationFailed``).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from billing.api.errors import HANDLED, answers, domain_error, raw_answer, render
from billing.auth.guard import ADMITTED_ROLE, TokenCache, bearer, known_role
from billing.errors import (
    BadRequest,
    BodyTimeout,
    TooLarge,
    UnsupportedMediaType,
)
from billing.settings import Settings, get_settings

#: The ``Host`` names served in open mode (the port does not matter).
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
#: A gzip body may inflate to at most this many times its size: a batch of JSON events
#: compresses some 5 to 20 times; a bomb compresses a thousand times.
MAX_GZIP_RATIO = 100
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: What an HTML form without script sends (the console's sign-in and sign-out).
FORM_MEDIA_TYPE = "application/x-www-form-urlencoded"
#: The scope key of the body read by ``RequestLimits`` (``admitted_body``).
BODY_KEY = "billing.body"


class RequestLimits:
    """The ASGI middleware of the request limits (see the module's docstring).

    ``tokens``: the app's token cache (asked for each request: ``app.state.tokens``);
    ``gzip_paths``: the routes that take ``Content-Encoding: gzip``; ``body_limits``: the body
    limit of a route by path (``settings.max_body_bytes`` for any other); ``form_paths``: the
    HTML form routes by path, with their body limit.
    """

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings,
        tokens: Callable[[], TokenCache],
        body_limits: dict[str, int],
        gzip_paths: frozenset[str],
        form_paths: dict[str, int],
    ) -> None:
        self.app = app
        self.settings = settings
        self.tokens = tokens
        self.body_limits = body_limits
        self.gzip_paths = gzip_paths
        self.form_paths = form_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            scope, receive = await self._admit(scope, receive)
        except ClientDisconnect:
            return  # the client hung up before its body arrived: nobody to answer
        except HANDLED as error:
            answer = domain_error(error, self.settings.db_retry_after_s)
            if answer is None:
                raise
            await render(answer, close=True)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _admit(self, scope: Scope, receive: Receive) -> tuple[Scope, Receive]:
        headers = _admission_headers(scope)
        host = headers.get("host", "")
        if _hostname(host) not in LOOPBACK_HOSTS and not await self._auth_enabled():
            raise BadRequest(
                f"Host {host!r} is not served in open mode (no API token exists yet): only "
                "localhost, 127.0.0.1 and [::1] are; create a token (`billing tokens create "
                "--role admin`) to serve other names"
            )
        if scope["method"] not in _BODY_METHODS:
            return scope, receive
        media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
        path = scope["path"]
        if path in self.form_paths:
            return scope, await self._form(scope, receive, headers, media_type)
        if media_type != "application/json":
            # Even a POST without a body (``curl -X POST …/void``): a web page can make a
            # browser send one of those anywhere, with no type, and no preflight.
            raise UnsupportedMediaType(
                f"a {scope['method']} body must be sent with Content-Type: application/json"
                + (f", not {media_type!r}" if media_type else " (none was given)")
                + (
                    ", even where the endpoint takes none: send `{}`"
                    if not media_type and _bodiless(headers)
                    else ""
                )
            )
        encoding = headers.get("content-encoding", "identity").strip().lower()
        gzip = encoding == "gzip" and path in self.gzip_paths
        if encoding not in ("identity", "") and not gzip:
            taken = "identity or gzip" if path in self.gzip_paths else "identity only"
            raise UnsupportedMediaType(
                f"Content-Encoding {encoding!r} is not taken here ({taken}); send the body as is"
            )
        role: str | None = None
        if await self._auth_enabled():
            presented = bearer(headers.get("authorization", ""))
            role = known_role(await self.tokens().role_async(presented))
        limit = self.body_limits.get(path, self.settings.max_body_bytes)
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise TooLarge(f"request body is {declared} bytes; the limit is {limit}")
        body = await read_within(receive, limit, self.settings.body_timeout_s, declared)
        if gzip:
            body = gunzip(body, limit)
            scope = dict(scope)
            scope["headers"] = [
                (name, value)
                for name, value in scope["headers"]
                if name not in (b"content-encoding", b"content-length")
            ] + [(b"content-length", b"%d" % len(body))]
        scope[BODY_KEY] = body
        if role is not None:
            scope[ADMITTED_ROLE] = role
        return scope, _replay(body, receive)

    async def _form(
        self, scope: Scope, receive: Receive, headers: dict[str, str], media_type: str
    ) -> Receive:
        """The body of an HTML form route: form-encoded only (415), within its limit (413)."""
        if media_type != FORM_MEDIA_TYPE:
            raise UnsupportedMediaType(
                f"this form takes Content-Type: {FORM_MEDIA_TYPE}"
                + (f", not {media_type!r}" if media_type else " (none was given)")
            )
        limit = self.form_paths[scope["path"]]
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise TooLarge(f"request body is {declared} bytes; the limit is {limit}")
        body = await read_within(receive, limit, self.settings.body_timeout_s, declared)
        scope[BODY_KEY] = body
        return _replay(body, receive)

    async def _auth_enabled(self) -> bool:
        return await self.tokens().auth_enabled_async()


def _bodiless(headers: dict[str, str]) -> bool:
    """Whether the request says it sends no body: no ``Transfer-Encoding``, and no
    ``Content-Length`` or one of 0."""
    return "transfer-encoding" not in headers and headers.get("content-length", "0") == "0"


def declare(routes: list[Any]) -> None:
    """Add the answers of the limits to the OpenAPI ``responses`` of ``routes`` (FastAPI
    ``APIRoute``s) that do not declare them already: 400 (a ``Host`` not served in open mode) on
    every route, and 408, 413, 415 on those that take a ``POST``."""
    for route in routes:
        if hasattr(route, "original_router"):  # FastAPI's included routers
            declare(route.original_router.routes)
            continue
        if not isinstance(route, APIRoute) or not route.path.startswith("/v1"):
            continue
        statuses = (400, 408, 413, 415) if "POST" in (route.methods or ()) else (400,)
        for status, response in answers(*statuses).items():
            route.responses.setdefault(status, response)


def admitted_body(request: Request) -> bytes:
    """The body of a ``POST`` (``PUT``, ``PATCH``) request as ``RequestLimits`` read it: within
    the route's limit, in full, inflated."""
    body: bytes = request.scope[BODY_KEY]
    return body


#: The headers the limits read (ASGI gives names in lower case).
_ADMISSION_HEADERS = frozenset(
    (
        b"host",
        b"content-type",
        b"content-encoding",
        b"authorization",
        b"content-length",
        b"transfer-encoding",
    )
)


def _admission_headers(scope: Scope) -> dict[str, str]:
    """The first value of each of ``_ADMISSION_HEADERS`` that the request has, by name (as
    ``starlette.datastructures.Headers.get`` reads them, in one pass over the headers)."""
    found: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name in _ADMISSION_HEADERS:
            found.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return found


def _hostname(host: str) -> str:
    """The name of a ``Host`` header without its port, lower case (``[::1]`` keeps brackets)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() else host


async def read_within(
    receive: Receive, limit: int, timeout_s: float, declared: str | None
) -> bytes:
    """The whole body: 413 as soon as it passes ``limit`` bytes, 408 when it has not arrived
    within ``timeout_s``; ``ClientDisconnect`` when the client hangs up first."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect
                chunk: bytes = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise TooLarge(f"request body is over the limit of {limit} bytes")
                if not message.get("more_body", False):
                    if not chunks:
                        return chunk  # the whole body in one message, as it nearly always is
                    chunks.append(chunk)
                    break
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(
            f"the request body did not arrive in full within {timeout_s:g} s ({size} bytes "
            f"received{'' if declared is None else f' of the {declared} declared'}); "
            "send the whole body at once"
        ) from None
    return b"".join(chunks)


def gunzip(data: bytes, limit: int, ratio: int = MAX_GZIP_RATIO) -> bytes:
    """Inflate one gzip member: at most ``limit`` bytes and ``ratio`` times ``len(data)`` (413
    past either, inflating no further), 400 for data that is not one whole gzip member."""
    cap = min(limit, ratio * len(data))
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        body = inflater.decompress(data, cap + 1)
    except zlib.error as error:
        raise BadRequest(
            f"the body is not valid gzip ({error}); send gzip data with Content-Encoding: gzip, "
            "or the plain body without it"
        ) from None
    if len(body) > cap:
        if cap < limit:
            raise TooLarge(
                f"the gzip body inflates to more than {ratio} times its {len(data)} bytes; "
                "send it uncompressed"
            )
        raise TooLarge(f"the gzip body inflates to more than the limit of {limit} bytes")
    if not inflater.eof or inflater.unused_data:
        raise BadRequest("the body is not one whole gzip stream (truncated, or data after its end)")
    return body


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` whole, then waits for the client's disconnect."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the connection limits of the module's docstring
    (the settings of the environment: ``billing serve``'s)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self._max_head = settings.max_header_bytes
        self._head_timeout_s = settings.header_timeout_s
        self._in_head = True
        self._head_bytes = 0
        self._tail = b""
        self._head_timer: asyncio.TimerHandle | None = None
        #: the body's bytes still to come by its Content-Length (``None``: chunked)
        self._body_left: int | None = 0
        self._body_seen = 0  # body bytes the parser gave, in all
        self._ended = 0  # requests the parser ended, in all

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # The bytes of a head are counted before the parser sees them, up to the blank line
        # that ends it: the parser never holds more than the limit. The parser is given a
        # head, then a body by its Content-Length, one at a time, so that a request pipelined
        # behind another in the same read is counted from its first byte too.
        while data and not self.transport.is_closing():  # closing: answered, the rest unread
            if self._in_head:
                seen = self._tail + data
                end = seen.find(b"\r\n\r\n")
                cut = len(data) if end < 0 else end + 4 - len(self._tail)  # >= 1
                self._head_bytes += cut
                self._tail = seen[-3:] if end < 0 else b""
                if self._over_the_limit():
                    return
                piece, data = data[:cut], data[cut:]
            elif self._body_left:
                piece, data = data[: self._body_left], data[self._body_left :]
                self._body_left -= len(piece)
            else:  # a chunked body (or one longer than its Content-Length said): whole
                self._body_left = None
                piece, data = data, b""
            whole = self._body_left is None
            seen_before, ended_before = self._body_seen, self._ended
            super().data_received(piece)
            if whole and self._ended != ended_before:
                # A request ended within the piece: all of it that was no body counts as the
                # next one's head (the chunks' sizes and line ends too, a few bytes over).
                self._head_bytes = len(piece) - (self._body_seen - seen_before)
                if self._in_head:
                    self._tail, self._body_left = piece[-3:], 0
                self._over_the_limit()

    def _over_the_limit(self) -> bool:
        """Refuse (431) a head over the limit; whether it was."""
        if self._head_bytes <= self._max_head:
            return False
        self._refuse(
            431,
            "Request Header Fields Too Large",
            f"the request line and headers are over the limit of {self._max_head} bytes",
        )
        return True

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        if self._head_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        headers = dict(self.headers)
        length = headers.get(b"content-length")
        if b"transfer-encoding" in headers:
            self._body_left = None
        else:
            self._body_left = int(length) if length is not None and length.isdigit() else 0
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_seen += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # The request has ended, body and all: what follows is the next request's head
        # (uvicorn's keep-alive timeout closes a connection that stays idle).
        self._ended += 1
        self._in_head = True
        self._head_bytes = 0
        self._tail = b""

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self._head_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        if self._head_bytes == 0 and self.cycle is None:
            self.transport.close()  # a connection that never sent a byte: nobody to answer
            return
        self._refuse(
            408,
            "Request Timeout",
            f"the request line and headers did not arrive within {self._head_timeout_s:g} s",
        )

    def _refuse(self, status: int, reason: str, message: str) -> None:
        self._disarm()
        self._in_head = False
        self.transport.write(raw_answer(status, reason, message))
        self.transport.close()
