"""A small OpenAI-compatible gateway with billing: ``POST /v1/chat/completions`` (streamed or
not) in front of an upstream, metered by :mod:`billing.gateway`.

    BILLING_TOKEN=... python examples/fastapi_gateway.py --port 9000 \
        --upstream https://api.openai.com --billing http://127.0.0.1:8000 [--no-drain] \
        [--no-authorize]

The customer's key id comes from the ``X-Api-Key-Id`` header (a stand-in for the gateway's own
key lookup); a request without it, without a string ``model``, with a ``stream`` that is not a
boolean, or with a key id or model the billing service would refuse (``meters.call``: too long,
control characters) is refused (400) before anything is sent upstream: no upstream call
without a call record. The call's id is the gateway's own
(``gw-`` and 32 hex digits, minted by ``meters.call``), never the client's: a client's
``X-Request-Id`` is kept as the call's metadata ``client_request_id`` only (a reused one would
otherwise bill several generations as one call). The call's id is passed on upstream and comes
back to the client as ``X-Request-Id`` (the upstream's own as ``X-Upstream-Request-Id``, beside
its rate-limit headers). Each call is authorized against the budgets before the upstream is
opened (a refusal answers 402 or 429 in OpenAI's error shape) unless ``--no-authorize``; an
upstream that fails before a byte gives the hold back, and its error is the answer. A streamed
call always asks the upstream for its usage; a client that did not ask for it
(``stream_options.include_usage`` not ``true``) does not get the usage chunk. After a client
disconnect the upstream is drained (read on to its final usage) unless ``--no-drain``. At
shutdown the meters settle what is in flight (``Meters.shutdown``: a grace period, then flagged
estimates) and the billing client delivers or spools what it holds.
The billing lines are marked ``# billing``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from billing.client import AsyncBillingClient  # billing
from billing.gateway import DrainPolicy, Meters  # billing


def _refuse(message: str) -> Response:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    return JSONResponse({"error": error}, 400)


def create_app(
    upstream_url: str,
    billing_url: str,
    *,
    drain: bool = True,
    grace_s: float = 10,
    authorize: bool = True,
) -> FastAPI:
    """The gateway app; the billing token is read from ``BILLING_TOKEN``."""
    billing = AsyncBillingClient(billing_url, token=os.environ.get("BILLING_TOKEN"))  # billing
    meters = Meters(  # billing
        billing,  # billing
        drain=DrainPolicy(enabled=drain),  # billing
        shutdown_grace_s=grace_s,  # billing
        authorize=authorize,  # billing
    )  # billing
    http = httpx.AsyncClient(base_url=upstream_url, timeout=httpx.Timeout(60, connect=5))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with meters.lifespan(app):  # billing: at shutdown drains, estimates, flush
            yield
        await http.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            body: Any = await request.json()
        except ValueError:
            return _refuse("the body is not JSON")
        key_id = request.headers.get("x-api-key-id")
        if not key_id:  # billing: a call no one can be billed for is not made
            return _refuse("X-Api-Key-Id is required")
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("model"), str)
            or not body["model"]
        ):
            return _refuse("model is required")
        if not isinstance(body.get("stream", False), bool):  # "true" (a string) would bill $0
            return _refuse("stream must be true or false")
        streamed = body.get("stream") is True
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            return _refuse("stream_options must be an object")
        client_wants_usage = options.get("include_usage") is True  # the README's rule
        if streamed:  # the upstream's usage ends the stream (metered, hidden if not asked for)
            body["stream_options"] = {**options, "include_usage": True}
        meter = meters.call(  # billing: the call's id is the gateway's (meter.request_id)
            api_key_id=key_id,  # billing
            model=body["model"],  # billing
            protocol="openai.chat_completions",  # billing
            body=body,  # billing
            client_request_id=request.headers.get("x-request-id"),  # billing: metadata only
        )  # billing
        upstream = http.build_request(
            "POST", "/v1/chat/completions", json=body, headers={"X-Request-Id": meter.request_id}
        )
        # authorized, the upstream is opened: a stream relayed, a whole response (or the
        # provider's error) metered and answered as it came, no answer a 502
        return meter.response(  # billing
            lambda: http.send(upstream, stream=streamed),  # billing
            hide_usage=not client_wants_usage,  # billing
        )  # billing

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--upstream", required=True, help="the upstream's base URL")
    parser.add_argument("--billing", required=True, help="the billing service's base URL")
    parser.add_argument(
        "--no-drain", action="store_true", help="cancel the upstream when a client leaves"
    )
    parser.add_argument(
        "--no-authorize", action="store_true", help="call the upstream without a budget check"
    )
    parser.add_argument(
        "--grace-s",
        type=float,
        default=10,
        help="at shutdown, seconds uvicorn waits for the responses in flight, then as long "
        "for the meters' drains: keep twice this under the orchestrator's grace period",
    )
    args = parser.parse_args(argv)
    app = create_app(
        args.upstream,
        args.billing,
        drain=not args.no_drain,
        grace_s=args.grace_s,
        authorize=not args.no_authorize,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=int(args.grace_s),
    )


if __name__ == "__main__":
    main()
