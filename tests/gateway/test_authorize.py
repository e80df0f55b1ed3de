"""``Meters(billing, authorize=True)`` (billing.gateway.authorize): a gateway app served by uvicorn
in this process, in front of the fake upstream (which counts its requests), authorizing against
the real service (or one that answers 503, or nothing): a refusal in each protocol's own error
shape with no upstream request, ``fail_open`` on and off (each logged), an upstream that cannot
be opened releases its hold (CONTRACT "Authorizations and holds (v3)")."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from billing.client import AsyncBillingClient, BillingClient
from billing.gateway import Meters
from billing.gateway.authorize import estimate_of
from tests.conftest import LiveServer, _free_port
from tests.fakes.upstream import FakeUpstream
from tests.gateway.harness import PATHS, Billing, billing_server

#: Each protocol's field for the output limit.
LIMIT = {
    "openai.chat_completions": "max_completion_tokens",
    "openai.responses": "max_output_tokens",
    "anthropic.messages": "max_tokens",
}


@contextmanager
def gateway(
    upstream: str,
    billing_url: str,
    token: str | None,
    *,
    reused_id: str | None = None,
    **options: Any,
) -> Iterator[str]:
    """A gateway for the three protocols' paths: ``meter.response(opener)`` with
    ``Meters(..., authorize=True, **options)``; the key id from ``X-Api-Key-Id``. Each call's
    id is the gateway's own (the response's ``X-Request-Id``); ``reused_id``: the gateway's
    code names every call so (a bug of the gateway's, which the service answers 409)."""
    client = AsyncBillingClient(billing_url, token=token, spool_path=None, max_retries=0)
    meters = Meters(client, authorize=options.pop("authorize", True), **options)
    http = httpx.AsyncClient(base_url=upstream, timeout=30)
    app = FastAPI()

    def route(protocol: str) -> None:
        async def relay(request: Request) -> Response:
            body = await request.json()
            meter = meters.call(
                request_id=reused_id,  # None: a new id of the gateway's own
                api_key_id=request.headers["x-api-key-id"],
                model="fake-model",
                protocol=protocol,
                body=body,
                client_request_id=request.headers.get("x-request-id"),
            )
            built = http.build_request(
                "POST", PATHS[protocol], json=body, headers={"X-Request-Id": meter.request_id}
            )
            return meter.response(lambda: http.send(built, stream=True))

        app.post(PATHS[protocol])(relay)

    for protocol in PATHS:
        route(protocol)
    with LiveServer(app) as server:
        yield server.url


def _call(url: str, protocol: str, rid: str, key: str, limit: int) -> httpx.Response:
    """One call; ``rid`` is the client's X-Request-Id (metadata only: the call's id is the
    response's ``x-request-id``, :func:`_id`)."""
    body: dict[str, Any] = {"model": "fake-model", "stream": True, LIMIT[protocol]: limit}
    if protocol == "openai.chat_completions":
        body["stream_options"] = {"include_usage": True}
    headers = {"X-Request-Id": rid, "X-Api-Key-Id": key}
    return httpx.post(url + PATHS[protocol], json=body, headers=headers, timeout=30)


def _id(answer: httpx.Response) -> str:
    """The call's id: the gateway's own, never the client's X-Request-Id."""
    rid = answer.headers["x-request-id"]
    assert rid.startswith("gw-") or rid == "rej-409", rid
    return rid


#: The service's answers (to 401, 422 and 409) as the ERROR lines carry them.
SERVICE_ANSWERS = (
    '{"error": "the bearer token is unknown, revoked or expired"}',
    '{"errors": [{"index": null, "path": "body.ttl_s", '
    '"message": "Input should be greater than or equal to 10"}]}',
    '{"error": "request_id \'rej-409\' was authorized with another body; send the same body '
    'again, or a new request_id"}',
)


def _budget(billing: Billing, key: str) -> None:
    made = httpx.post(
        billing.url + "/v1/budgets",
        json={"budget_id": f"b_{key}", "scope": {"api_key_id": key}, "limit_usd": "1"}
        | {"period": "total"},
        headers={"Authorization": f"Bearer {billing.admin_token}"},
    )
    assert made.status_code == 201, made.text


def test_a_denied_call_gets_its_protocols_error_shape_and_never_reaches_the_upstream(
    db_url: str,
) -> None:
    with FakeUpstream(total=5) as fake, billing_server(db_url) as billing:
        _budget(billing, "key_g")
        with gateway(fake.url, billing.url, billing.ingest_token) as url:
            denied = {p: _call(url, p, f"deny-{p}", "key_g", 200_000) for p in PATHS}
            allowed = _call(url, "anthropic.messages", "allow-a", "key_g", 100)
    message = "budget b_key_g: estimate_exceeds_limit"  # $2 of output at $10/M, over $1
    openai = {
        "error": {
            "message": message,
            "type": "insufficient_quota",
            "param": None,
            "code": "estimate_exceeds_limit",
        }
    }
    anthropic = {"type": "error", "error": {"type": "billing_error", "message": message}}
    assert denied["openai.chat_completions"].json() == openai
    assert denied["openai.responses"].json() == openai
    assert denied["anthropic.messages"].json() == anthropic
    for answer in denied.values():
        assert answer.status_code == 402 and "retry-after" not in answer.headers
    assert allowed.status_code == 200 and b"message_stop" in allowed.content
    # the upstream: never called for a denied call, once for the allowed one
    assert {rid: len(gens) for rid, gens in fake.records.items()} == {_id(allowed): 1}
    assert len({_id(a) for a in denied.values()} | {_id(allowed)}) == 4


def _unavailable() -> FastAPI:
    """A billing service that cannot decide: 503 with ``Retry-After: 7`` to every request."""
    app = FastAPI()

    @app.post("/v1/authorizations")
    async def authorize() -> JSONResponse:
        return JSONResponse({"error": "database unavailable"}, 503, {"Retry-After": "7"})

    return app


def test_without_a_decision_fail_open_decides_and_each_call_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="billing.gateway")
    nowhere = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    with FakeUpstream(total=5) as fake, LiveServer(_unavailable()) as down:
        with gateway(fake.url, down.url, None) as url:
            opened = _call(url, "openai.chat_completions", "open-503", "key_u", 100)
        with gateway(fake.url, nowhere, None) as url:
            unreachable = _call(url, "openai.chat_completions", "open-none", "key_u", 100)
        with gateway(fake.url, down.url, None, fail_open=False) as url:
            closed = _call(url, "openai.chat_completions", "closed-503", "key_u", 100)
            closed_a = _call(url, "anthropic.messages", "closed-a", "key_u", 100)
        with gateway(fake.url, nowhere, None, fail_open=False) as url:
            closed_none = _call(url, "openai.responses", "closed-none", "key_u", 100)
    opened_id, unreachable_id = _id(opened), _id(unreachable)
    assert (opened.status_code, unreachable.status_code) == (200, 200)
    # the upstream: once for each call opened, never for a refused one
    assert {rid: len(gens) for rid, gens in fake.records.items()} == {
        opened_id: 1,
        unreachable_id: 1,
    }
    assert (closed.status_code, closed.headers["retry-after"]) == (503, "7")
    assert closed.json() == {
        "error": {
            "message": "the billing service cannot authorize the call now",
            "type": "service_unavailable",
            "param": None,
            "code": "authorization_unavailable",
        }
    }
    assert closed_a.status_code == 503
    assert closed_a.json()["error"]["type"] == "overloaded_error"
    # unreachable and fail_open off: refused (no Retry-After: nothing said when to come back)
    assert closed_none.status_code == 503 and "retry-after" not in closed_none.headers
    assert closed_none.json()["error"]["code"] == "authorization_unavailable"
    lines = [r.getMessage() for r in caplog.records if r.name == "billing.gateway"]
    assert len(lines) == 5, lines
    assert lines[0].startswith(f"authorization of {opened_id} unavailable (authorization: HTTP 503")
    assert lines[0].endswith(": calling the upstream (fail_open)")
    assert lines[1].startswith(f"authorization of {unreachable_id} unavailable (authorization: no")
    assert lines[2].endswith(": refusing the call") and _id(closed) in lines[2]
    assert lines[4].startswith(f"authorization of {_id(closed_none)} unavailable (authorization")
    assert lines[4].endswith(": refusing the call")
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "billing.gateway")


def test_a_refused_authorization_request_is_refused_whatever_fail_open_says(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """401 (a bad token), 422 (a TTL out of range) and 409 (a request_id reused with another
    body) from the real service are no outage: ``fail_open`` on, the call is still refused
    (500 in the protocol's shape; 400 ``invalid_request_error`` for the 422, which an SDK does
    not retry), the upstream never called, the service's answer logged at ERROR."""
    caplog.set_level(logging.WARNING, logger="billing.gateway")
    with FakeUpstream(total=5) as fake, billing_server(db_url) as billing:
        with gateway(fake.url, billing.url, "not-a-token", fail_open=True) as url:
            bad_token = _call(url, "openai.chat_completions", "rej-401", "key_x", 100)
        with gateway(fake.url, billing.url, billing.ingest_token, hold_ttl_s=5) as url:
            bad_ttl = _call(url, "anthropic.messages", "rej-422", "key_x", 100)
        with gateway(fake.url, billing.url, billing.ingest_token, reused_id="rej-409") as url:
            first = _call(url, "openai.responses", "rej-409", "key_x", 100)
            reused = _call(url, "openai.responses", "rej-409", "key_x", 200)  # another estimate
    assert bad_token.status_code == 500 and "retry-after" not in bad_token.headers
    assert bad_token.json() == {
        "error": {
            "message": "the billing service refused the gateway's authorization request "
            "(HTTP 401); see the gateway's log",
            "type": "server_error",
            "param": None,
            "code": "authorization_rejected",
        }
    }
    assert bad_ttl.status_code == 400
    assert bad_ttl.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "the billing service refused a field of the gateway's authorization "
            "request (HTTP 422); see the gateway's log",
        },
    }
    assert (first.status_code, reused.status_code) == (200, 500)
    assert reused.json()["error"]["code"] == "authorization_rejected"
    assert "(HTTP 409)" in reused.json()["error"]["message"]
    # the upstream: never called for a refused request; once for the first rej-409
    assert {rid: len(gens) for rid, gens in fake.records.items()} == {"rej-409": 1}
    assert (_id(first), _id(reused)) == ("rej-409", "rej-409")
    records = [r for r in caplog.records if r.name == "billing.gateway"]
    assert [r.levelno for r in records] == [logging.ERROR] * 3, [r.getMessage() for r in records]
    lines = [r.getMessage() for r in records]
    tail = ": refusing the call (fail_open applies only to an unavailable service)"
    assert all(line.endswith(tail) for line in lines), lines
    assert lines[0].startswith(
        f"authorization of {_id(bad_token)} rejected (authorization: HTTP 401"
    )
    assert lines[1].startswith(f"authorization of {_id(bad_ttl)} rejected (authorization: HTTP 422")
    assert lines[2].startswith("authorization of rej-409 rejected (authorization: HTTP 409")
    # each with the service's own answer
    for line, answer in zip(lines, SERVICE_ANSWERS, strict=True):
        assert f"; the service answered {answer}: refusing" in line, line


@pytest.mark.parametrize("authorize", [True, False])
def test_a_key_id_or_model_the_service_would_refuse_is_a_400_before_anything_is_sent(
    db_url: str, authorize: bool
) -> None:
    """An ``X-Api-Key-Id`` of 300 characters, or with a control character (a tab), is refused
    by the meter with ``stream.started``'s own rule: 400 ``invalid_request_error`` in each
    protocol's shape, with or without ``authorize``; the upstream gets no request and the
    service no event and no authorization."""
    with FakeUpstream(total=5) as fake, billing_server(db_url) as billing:
        with gateway(fake.url, billing.url, billing.ingest_token, authorize=authorize) as url:
            long_key = _call(url, "openai.chat_completions", "bad-long", "k" * 300, 100)
            tab_key = _call(url, "anthropic.messages", "bad-tab", "key\tx", 100)
        admin = {"Authorization": f"Bearer {billing.admin_token}"}
        calls = httpx.get(billing.url + "/v1/calls", headers=admin)
    assert long_key.status_code == 400, long_key.text
    assert long_key.json() == {
        "error": {
            "message": "api_key_id is too long: at most 128 characters",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_request",
        }
    }
    assert tab_key.status_code == 400, tab_key.text
    assert tab_key.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "api_key_id must be printable text (no control characters)",
        },
    }
    assert fake.records == {}  # the upstream: not a request
    assert calls.status_code == 200 and calls.json()["data"] == []


def test_an_upstream_that_cannot_be_opened_releases_the_hold(db_url: str) -> None:
    nowhere = f"http://127.0.0.1:{_free_port()}"  # no upstream listens there
    with billing_server(db_url) as billing:
        _budget(billing, "key_r")
        with gateway(nowhere, billing.url, billing.ingest_token) as url:
            failed = _call(url, "openai.responses", "gone-1", "key_r", 1_000)
        gone_id = _id(failed)
        admin = {"Authorization": f"Bearer {billing.admin_token}"}
        status = httpx.get(billing.url + "/v1/budgets/b_key_r", headers=admin).json()
        again = httpx.delete(
            billing.url + f"/v1/authorizations/{gone_id}",
            headers={"Authorization": f"Bearer {billing.ingest_token}"},
        )
    assert failed.status_code == 502
    error = failed.json()["error"]
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_unavailable")
    assert (status["held_usd"], status["spent_usd"]) == ("0", "0")
    # the hold existed ($0.01: 1,000 output tokens at $10/M) and was released by the gateway
    assert again.json()["state"] == "released" and again.json()["hold_usd"] == "0.01"


def test_authorize_needs_the_async_client_and_an_opener() -> None:
    sync = BillingClient("http://127.0.0.1:9", spool_path=None)
    try:
        with pytest.raises(TypeError, match="AsyncBillingClient"):
            Meters(sync, authorize=True)
    finally:
        sync.close(timeout=0)
    meters = Meters(AsyncBillingClient("http://127.0.0.1:9", spool_path=None), authorize=True)
    meter = meters.call(
        request_id="r", api_key_id="k", model="fake-model", protocol="openai.chat_completions"
    )
    with pytest.raises(TypeError, match="opener"):
        meter.response(httpx.Response(200, content=b""))


def test_the_estimate_is_the_requests_own_output_limit() -> None:
    chat = "openai.chat_completions"
    both = {"max_completion_tokens": 300, "max_tokens": 900}
    assert estimate_of(chat, both, input_tokens=12) == {
        "input_tokens": 12,
        "max_output_tokens": 300,
    }
    assert estimate_of(chat, {"max_tokens": 900}, input_tokens=None)["max_output_tokens"] == 900
    responses = estimate_of("openai.responses", {"max_tokens": 5}, input_tokens=None)
    assert responses == {"input_tokens": 0, "max_output_tokens": 4096}  # not its field
    anthropic = estimate_of("anthropic.messages", {"max_tokens": 64}, input_tokens=3)
    assert anthropic == {"input_tokens": 3, "max_output_tokens": 64}
    fixed = estimate_of(chat, both, input_tokens=12, amount_usd=Decimal("0.05"))
    assert fixed == {"amount_usd": Decimal("0.05")}
