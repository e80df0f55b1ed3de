"""The ASGI response of a metered stream (:meth:`billing.gateway.Meter.response`).

A Starlette ``Response`` whose body is written by the attempt's pump itself
(:mod:`billing.gateway.pump`), one task step a chunk as a plain relay; the response's own task
sends the head, listens for the client's ``http.disconnect`` and runs the attempts
(``Meter._serve``). A FastAPI / Starlette endpoint returns it as it would a
``StreamingResponse``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

__all__ = ["MeteredResponse", "Prepare", "Serve", "disconnected"]


#: ``serve(send, receive, head)``: sends the head (the ``http.response.start`` message given),
#: then the body.
Serve = Callable[[Send, Receive, Message], Awaitable[None]]
#: Runs before the head: ``None`` to serve the stream, else the response to give instead (a
#: refusal of the authorization, the upstream's error).
Prepare = Callable[[], Awaitable[Response | None]]


class MeteredResponse(Response):
    """``serve`` writes the head (status, headers, media type) and the body, unless
    ``prepare`` (run first) gives a response to send instead.

    Raises:
        RuntimeError: served for a scope other than ``http``.
    """

    def __init__(
        self,
        serve: Serve,
        *,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str = "text/event-stream",
        prepare: Prepare | None = None,
    ) -> None:
        # as StreamingResponse: no body, hence no content-length
        self.status_code = status_code
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)
        self._serve = serve
        self._prepare = prepare

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise RuntimeError("a metered stream is an http response")
        if self._prepare is not None:
            instead = await self._prepare()
            if instead is not None:
                await instead(scope, receive, send)
                return
        head = {
            "type": "http.response.start",
            "status": self.status_code,
            "headers": self.raw_headers,
        }
        await self._serve(send, receive, head)


async def disconnected(receive: Receive) -> None:
    """Returns once the client is gone (ASGI ``http.disconnect``, or a ``receive`` that fails);
    a body not yet read by the endpoint is read and dropped on the way."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a server that cannot say any more has lost the client
        return
