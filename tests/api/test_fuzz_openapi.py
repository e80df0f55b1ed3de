"""The API describes itself: its OpenAPI document declares every route's body, query parameters,
answers and auth; real answers match the models the routes declare; and schemathesis fuzzes the
API from that document (no 5xx, statuses and answers as declared).

Runs against the test's real database (SQLite or PostgreSQL); a bounded number of examples per
operation keeps it inside CI's time.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from pydantic import BaseModel
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from billing.api.errors import ConflictBody, ErrorBody, ValidationErrors, render
from billing.auth.guard import TokenCache
from billing.auth.tokens import create_token
from billing.calllog import queries, usage
from billing.calllog.schemas import CallsParams, UsageParams
from billing.dimensions import BUCKETS
from billing.errors import (
    BillingError,
    BodyTimeout,
    Conflict,
    EventConflict,
    FieldError,
    Forbidden,
    NotFound,
    PriceConflict,
    TooLarge,
    Unauthorized,
    Unavailable,
    ValidationFailed,
)
from billing.export.params import PARAMETERS as EXPORT_PARAMETERS
from billing.export.schemas import CallsCsvParams, UsageCsvParams
from billing.rates import RATE_FIELDS
from billing.storage.db import write_transaction
from tests.auth.test_auth import _api_routes, _routes
from tests.builders import started, tokens
from tests.builders import usage as usage_event

pytestmark = pytest.mark.slow

EXAMPLES_PER_OPERATION = 30
#: Cases of the admin-token run in all (issue 44: at least 5,000).
FUZZ_CASES = int(os.environ.get("BILLING_FUZZ_CASES", "5000"))
JSON = {"Content-Type": "application/json"}
PERIOD = {"since": "2026-10-01T00:00:00Z", "until": "2026-11-01T00:00:00Z"}
PRICE = {
    "model": "m1",
    "effective_from": "2026-01-01T00:00:00Z",
    "input_usd_per_mtok": "0.30",
    "output_usd_per_mtok": "1.2",
    "cache_read_usd_per_mtok": "0.03",
    "cache_creation_usd_per_mtok": "0",
}


def _as_loopback(app: FastAPI) -> Any:
    """``app`` as the fuzzer calls it, on ``Host: 127.0.0.1``: schemathesis sends ``Host:
    testserver``, and the open mode serves loopback names only (``billing.api.limits``)."""

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = [(k, v) for k, v in scope["headers"] if k != b"host"]
            scope = {**scope, "headers": [*headers, (b"host", b"127.0.0.1")]}
        await app(scope, receive, send)

    return asgi


def test_no_server_error_and_responses_match_the_schema(app: FastAPI) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", _as_loopback(app))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/events", "/v1/calls", "/v1/usage"}
    for operation in operations:
        _fuzz(operation, EXAMPLES_PER_OPERATION)


def test_thousands_of_cases_with_an_admin_token(app: FastAPI) -> None:
    """Issue 44: every operation with an admin token (the guarded paths, not open mode's), at
    least ``BILLING_FUZZ_CASES`` (5,000) cases in all, and data the schema refuses refused too.
    In this process over ASGI, without the background worker: nothing is sent anywhere."""
    with write_transaction(app.state.billing.sessions) as session:
        admin, _ = create_token(session, "admin", "fuzz", datetime.now(UTC))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    per_operation = -(-FUZZ_CASES // len(operations))
    ran = 0
    while ran < FUZZ_CASES:  # an operation with few distinct cases runs them all: another round
        for operation in operations:
            ran += _fuzz(
                operation,
                per_operation,
                headers={"Authorization": f"Bearer {admin}"},
                extra=[negative_data_rejection],
            )


def _fuzz(
    operation: Any,
    examples: int,
    headers: dict[str, str] | None = None,
    extra: list[Any] | None = None,
) -> int:
    """Fuzz ``operation`` with up to ``examples`` cases; how many ran."""
    ran = 0

    @given(case=operation.as_strategy())
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def check(case: schemathesis.Case) -> None:
        nonlocal ran
        ran += 1
        case.call_and_validate(
            headers=headers,
            checks=[
                not_a_server_error,
                status_code_conformance,
                content_type_conformance,
                response_schema_conformance,
                *(extra or []),
            ],
        )

    check()
    return ran


def test_the_fuzzer_posts_events_from_the_declared_body(app: FastAPI) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", _as_loopback(app))
    operation = schema["/v1/events"]["POST"]
    bodies: list[Any] = []

    @given(case=operation.as_strategy())
    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
    def collect(case: schemathesis.Case) -> None:
        bodies.append(case.body)

    collect()
    types = {event["type"] for body in bodies for event in body["events"]}
    assert types, "no events generated"
    assert types <= {"stream.started", "stream.tokens", "stream.client_disconnected",
                     "stream.usage", "stream.failed"}  # fmt: skip


def test_every_v1_route_declares_its_answers_and_its_auth(app: FastAPI) -> None:
    document = app.openapi()
    documented = set()
    for path, operations in document["paths"].items():
        if not path.startswith("/v1"):
            continue
        for method, operation in operations.items():
            documented.add((method.upper(), path))
            where = (method, path)
            responses = operation["responses"]
            assert {"200", "201"} & set(responses), where
            assert {"401", "403", "503"} <= set(responses), where
            for status, response in responses.items():
                content = response.get("content")
                assert content, (*where, status)
                assert all(media.get("schema") for media in content.values()), (*where, status)
            assert operation["security"] == [{"bearer": []}], where
    # Every /v1 route the app serves is in the document (none is left out of the schema).
    served = {(method, re.sub(r":\w+}", "}", path)) for method, path in _routes(app)}  # {x:path}
    assert served and documented == served
    body = document["paths"]["/v1/events"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/EventBatch"
    }
    batch = document["components"]["schemas"]["EventBatch"]["properties"]["events"]
    assert (batch["minItems"], batch["maxItems"]) == (1, 1000)
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path in ("/healthz", "/readyz"):
        assert "security" not in document["paths"][path]["get"]


def test_token_and_price_fields_come_from_the_dimensions(app: FastAPI) -> None:
    schemas = app.openapi()["components"]["schemas"]
    for name in ("Call", "CallDetail", "LedgerEntry", "UsageRow"):
        properties = schemas[name]["properties"]
        for bucket in BUCKETS:
            assert properties[bucket.name]["description"] == bucket.doc, (name, bucket.name)
    for name in ("PriceIn", "PriceOut", "LedgerEntry"):
        assert set(RATE_FIELDS) <= set(schemas[name]["properties"]), name


@pytest.mark.nodb
def test_the_query_models_declare_what_the_parsers_read() -> None:
    assert tuple(CallsParams.model_fields) == queries.PARAMETERS
    assert tuple(UsageParams.model_fields) == usage.PARAMETERS
    assert tuple(UsageCsvParams.model_fields) == EXPORT_PARAMETERS["usage"]
    assert tuple(CallsCsvParams.model_fields) == EXPORT_PARAMETERS["calls"]


def _declared(app: FastAPI, method: str, path: str, status: int) -> type[BaseModel]:
    """The model the route declares for ``status``."""
    for route in _api_routes(app.routes):
        if route.path == path and method in route.methods:
            declared = route.responses.get(status, {}).get("model")
            if declared is None and status == (route.status_code or 200):
                declared = route.response_model
            assert declared is not None, (method, path, status)
            model: type[BaseModel] = declared
            return model
    raise AssertionError(f"no route {method} {path}")


BUDGET_CHANGE = {"scope": {"api_key_id": "key_1"}, "limit_usd": "10", "period": "month"}
BUDGET = {"budget_id": "b1", **BUDGET_CHANGE}


def test_real_answers_match_the_declared_models(app: FastAPI, client: TestClient) -> None:
    calls: list[tuple[str, str, str, dict[str, Any]]] = [
        ("POST", "/v1/prices", "/v1/prices", {"json": PRICE}),
        ("POST", "/v1/prices", "/v1/prices", {"json": PRICE}),
        ("POST", "/v1/prices", "/v1/prices", {"json": {**PRICE, "input_usd_per_mtok": "9"}}),
        ("POST", "/v1/prices", "/v1/prices", {"json": {**PRICE, "input_usd_per_mtok": 1.5}}),
        (
            "POST",
            "/v1/events",
            "/v1/events",
            {
                "json": {
                    "events": [
                        started("e1", input_tokens=12, metadata={"team": "a"}),
                        tokens("e2", 5, 4, at=1),
                        usage_event("e3", 12, 5, at=2, cache_read_input_tokens=3),
                        started("e4", rid="r2"),
                    ]
                }
            },
        ),
        ("POST", "/v1/events", "/v1/events", {"json": {"events": [started("e1")]}}),
        ("POST", "/v1/events", "/v1/events", {"json": {"events": [{"type": "x"}]}}),
        (
            "POST",
            "/v1/events",
            "/v1/events",
            {"content": b"[" * (1024 * 1024 + 1), "headers": JSON},
        ),
        ("POST", "/v1/events", "/v1/events", {"content": b"{}"}),  # not said to be JSON: 415
        ("POST", "/v1/reconcile", "/v1/reconcile", {}),
        ("GET", "/v1/calls", "/v1/calls", {"params": {"limit": "1"}}),
        ("GET", "/v1/calls", "/v1/calls", {"params": {"cursor": "nope", "colour": "x"}}),
        ("GET", "/v1/calls/{request_id:path}", "/v1/calls/r1", {}),
        ("GET", "/v1/calls/{request_id:path}", "/v1/calls/r2", {}),
        ("GET", "/v1/calls/{request_id:path}", "/v1/calls/nope", {}),
        ("GET", "/v1/usage", "/v1/usage", {"params": {**PERIOD, "group_by": "day,model"}}),
        ("GET", "/v1/usage", "/v1/usage", {"params": {**PERIOD, "basis": "booked"}}),
        ("GET", "/v1/usage", "/v1/usage", {"params": {"since": "yesterday"}}),
        ("GET", "/v1/prices", "/v1/prices", {}),
        ("GET", "/v1/prices", "/v1/prices", {"params": {"modle": "m1"}}),
        ("GET", "/v1/exports/usage.csv", "/v1/exports/usage.csv", {"params": {"tz": "Mars"}}),
        ("GET", "/v1/exports/calls.csv", "/v1/exports/calls.csv", {}),
        ("GET", "/healthz", "/healthz", {}),
        ("GET", "/readyz", "/readyz", {}),
        ("POST", "/v1/budgets", "/v1/budgets", {"json": BUDGET}),
        ("POST", "/v1/budgets", "/v1/budgets", {"json": BUDGET}),
        ("POST", "/v1/budgets", "/v1/budgets", {"json": {**BUDGET, "tz": "Mars"}}),
        ("GET", "/v1/budgets", "/v1/budgets", {}),
        ("GET", "/v1/budgets/{budget_id:path}", "/v1/budgets/b1", {}),
        ("GET", "/v1/budgets/{budget_id:path}", "/v1/budgets/nope", {}),
        ("GET", "/v1/spend", "/v1/spend", {"params": {"api_key_id": "key_1"}}),
        ("GET", "/v1/alerts", "/v1/alerts", {"params": {"budget_id": "b1"}}),
        ("PUT", "/v1/budgets/{budget_id:path}", "/v1/budgets/b1", {"json": BUDGET_CHANGE}),
        ("DELETE", "/v1/budgets/{budget_id:path}", "/v1/budgets/b1", {}),
    ]
    seen = set()
    for method, route, url, request in calls:
        response = client.request(method, url, **request)
        _assert_declared(app, method, route, response)
        seen.add(response.status_code)
    assert seen == {200, 201, 404, 409, 413, 415, 422}
    # With tokens: 401 and 403 are declared too.
    with write_transaction(app.state.billing.sessions) as session:
        secret, _ = create_token(session, "ingest", "test", datetime.now(UTC))
    app.state.tokens = TokenCache(app.state.billing.sessions)  # forget "no token yet"
    for token, status in ((None, 401), (secret, 403)):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = client.get("/v1/calls", headers=headers)
        assert response.status_code == status
        _assert_declared(app, "GET", "/v1/calls", response)


def _assert_declared(app: FastAPI, method: str, route: str, response: Any) -> None:
    """``response`` is valid for the model its route declares for its status, and for what the
    OpenAPI document says of it (as schemathesis reads it: types, required fields, nothing
    extra)."""
    _declared(app, method, route, response.status_code).model_validate_json(response.content)
    schema = schemathesis.openapi.from_asgi("/openapi.json", _as_loopback(app))
    schema[route.replace(":path", "")][method].validate_response(response)


@pytest.mark.nodb
def test_every_error_body_has_its_declared_shape() -> None:
    shaped: list[tuple[type[BaseModel], BillingError]] = [
        (ErrorBody, TooLarge("too large")),
        (ErrorBody, BodyTimeout("too slow")),
        (ErrorBody, NotFound("no such call")),
        (ErrorBody, PriceConflict("a different price")),
        (ErrorBody, Unauthorized("no token")),
        (ErrorBody, Forbidden("not this role")),
        (ErrorBody, Unavailable(5)),
        (ValidationErrors, ValidationFailed([FieldError(None, "query.x", "is unknown")])),
        (ConflictBody, EventConflict([Conflict(0, "e1")])),
    ]
    for model, error in shaped:
        model.model_validate(error.body())
    assert render(Unavailable(5)).headers["retry-after"] == "5"
    assert render(Unauthorized("no token")).headers["www-authenticate"] == "Bearer"
