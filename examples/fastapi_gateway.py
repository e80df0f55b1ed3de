"""A small OpenAI-compatible gateway with billing: ``POST /v1/chat/completions`` (``"stream":
true``) in front of an upstream, metered by :mod:`billing.gateway`.

    BILLING_TOKEN=... python examples/fastapi_gateway.py --port 9000 \
        --upstream https://api.openai.com --billing http://127.0.0.1:8000 [--no-drain] \
        [--no-authorize]

The customer's key id comes from the ``X-Api-Key-Id`` header (a stand-in for the gateway's own
key lookup), the call's id from ``X-Request-Id`` (else a new one; it is passed on upstream).
Each call is authorized against the budgets before the upstream is opened (a refusal answers
402 or 429 in OpenAI's error shape) unless ``--no-authorize``. After a client disconnect the
upstream is drained (read on to its final usage) unless ``--no-drain``. The billing lines are
marked ``# billing``.
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from billing.client import AsyncBillingClient  # billing
from billing.gateway import DrainPolicy, Meters  # billing


def create_app(
    upstream_url: str, billing_url: str, *, drain: bool = True, authorize: bool = True
) -> FastAPI:
    """The gateway app; the billing token is read from ``BILLING_TOKEN``."""
    billing = AsyncBillingClient(billing_url, token=os.environ.get("BILLING_TOKEN"))  # billing
    meters = Meters(billing, drain=DrainPolicy(enabled=drain), authorize=authorize)  # billing
    http = httpx.AsyncClient(base_url=upstream_url, timeout=httpx.Timeout(60, connect=5))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await meters.wait_drains(timeout=30)  # billing
        await billing.close(timeout=10)  # billing
        await http.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await request.json()
        if body.get("stream") is not True:
            return JSONResponse({"error": {"message": "this gateway streams only"}}, 400)
        body["stream_options"] = {**body.get("stream_options", {}), "include_usage": True}
        request_id = request.headers.get("x-request-id") or f"gw-{uuid.uuid4().hex}"
        upstream = http.build_request(
            "POST", "/v1/chat/completions", json=body, headers={"X-Request-Id": request_id}
        )
        meter = meters.call(  # billing
            request_id=request_id,  # billing
            api_key_id=request.headers["x-api-key-id"],  # billing
            model=body["model"],  # billing
            protocol="openai.chat_completions",  # billing
            body=body,  # billing
        )  # billing
        # authorized, the upstream is opened; its error (a status other than 200) is the answer
        return meter.response(lambda: http.send(upstream, stream=True))  # billing

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
    args = parser.parse_args(argv)
    app = create_app(
        args.upstream, args.billing, drain=not args.no_drain, authorize=not args.no_authorize
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
