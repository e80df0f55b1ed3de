"""Routes answered ahead of the framework (``billing.server.app``): the hot endpoints a gateway
calls once per upstream call, ``POST /v1/authorizations`` and ``GET /v1/credits/balance``, and
``DELETE /v1/authorizations/{request_id}`` (a gateway that gave up before calling).

Each is the route's own handler with its own guard, called as ASGI without the middleware stack,
routing (a walk over every route), dependency solving (a plain ``def`` dependency is a thread
hop each) and the exception middleware, which cost as much CPU as the handler's statements. The
errors are answered as ``billing.api.errors``' handlers answer them; a request the framework
must judge itself (a body its validation refuses: its 422 in its words) is handed back, and
the app routes it as any other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from billing.api.errors import HANDLED, domain_error, render
from billing.api.state import AppState

#: What a route's work returns: the JSON answer (200), or ``ROUTE`` to hand the request back.
Handle = Callable[[Request, AppState], Awaitable[Any]]

#: A handler's "not mine": the framework answers (nothing has been sent).
ROUTE = object()


async def serve(
    scope: Scope, receive: Receive, send: Send, state: AppState, handle: Handle
) -> int | None:
    """``handle``'s answer as JSON (200), or the ``BillingError`` it raised (a database outage:
    503) rendered; returns the status, or None when ``handle`` handed the request back. Any
    other exception propagates (the server answers 500, as the error middleware would)."""
    request = Request(scope, receive)
    try:
        content = await handle(request, state)
    except HANDLED as error:
        answer = domain_error(error, state.settings.db_retry_after_s)
        if answer is None:
            raise
        response = render(answer)
    else:
        if content is ROUTE:
            return None
        response = JSONResponse(content)
    await response(scope, receive, send)
    return response.status_code
