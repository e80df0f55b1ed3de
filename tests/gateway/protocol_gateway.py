"""A small gateway for ``POST /v1/responses`` and ``POST /v1/messages`` with the same meter as
``examples/fastapi_gateway.py`` (which serves Chat Completions), for the end-to-end tests;
Responses returns ``meter.response`` as the example does, Anthropic Messages the generator form
(``StreamingResponse(meter.relay(...))``), so that both run behind a real server:

    BILLING_TOKEN=... python -m tests.gateway.protocol_gateway --port P --upstream URL \
        --billing URL [--no-drain]

The call's id is the gateway's own (passed on upstream, and to the client as ``X-Request-Id``;
a client's ``X-Request-Id`` is the metadata ``client_request_id``), the key id comes from
``X-Api-Key-Id``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from billing.client import AsyncBillingClient
from billing.gateway import DrainPolicy, Meters

PATHS = {"openai.responses": "/v1/responses", "anthropic.messages": "/v1/messages"}


def create_app(upstream: str, billing_url: str, *, drain: bool = True) -> FastAPI:
    """A small gateway for ``/v1/responses`` and ``/v1/messages`` with the same meter as the
    example (for the protocols the example does not serve)."""
    client = AsyncBillingClient(
        billing_url, token=os.environ.get("BILLING_TOKEN"), flush_interval_s=0.2
    )
    meters = Meters(client, drain=DrainPolicy(enabled=drain))
    http = httpx.AsyncClient(base_url=upstream, timeout=60)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await meters.wait_drains(10)
        await client.close(10)
        await http.aclose()

    app = FastAPI(lifespan=lifespan)

    async def relay(request: Request, protocol: str) -> Response:
        body = await request.json()
        meter = meters.call(  # the call's id is the gateway's own (meter.request_id)
            api_key_id=request.headers["x-api-key-id"],
            model=body["model"],
            protocol=protocol,
            client_request_id=request.headers.get("x-request-id"),
        )
        upstream_request = http.build_request(
            "POST", PATHS[protocol], json=body, headers={"X-Request-Id": meter.request_id}
        )
        response = await http.send(upstream_request, stream=True)
        if protocol == "openai.responses":
            return meter.response(response)
        return StreamingResponse(
            meter.relay(response),
            media_type="text/event-stream",
            headers={"X-Request-Id": meter.request_id},
        )

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await relay(request, "openai.responses")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await relay(request, "anthropic.messages")

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a Responses / Anthropic Messages test gateway")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--billing", required=True)
    parser.add_argument("--no-drain", action="store_true")
    args = parser.parse_args(argv)
    app = create_app(args.upstream, args.billing, drain=not args.no_drain)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
