"""``GET /v1/exports/usage.csv`` and ``GET /v1/exports/calls.csv`` (CONTRACT "Export")."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from billing.api.errors import answers
from billing.api.openapi import query_parameters
from billing.api.state import AppState, get_state
from billing.auth.guard import allow
from billing.calllog.params import QueryReader
from billing.credits.schemas import CreditsManifest
from billing.export.columns import CALLS_COLUMNS, USAGE_TOTAL_COLUMNS
from billing.export.credits import CREDITS_COLUMNS, export_credits
from billing.export.params import ExportParams, Kind, parse_params
from billing.export.schemas import CallsCsvParams, UsageCsvParams
from billing.export.service import export_chunks, period_label

router = APIRouter()

_CSV = "text/csv; charset=utf-8"


def _route(params: type[BaseModel], header: str) -> dict[str, Any]:
    """The declarations both exports share: the ``export`` role, ``params`` as the query, a CSV
    answer whose header row is ``header``, and the errors."""
    return {
        "response_class": StreamingResponse,
        "dependencies": [Depends(allow("export"))],
        "openapi_extra": query_parameters(params),
        "responses": {
            200: {
                "description": f"CSV with one header row: {header}",
                "content": {"text/csv": {"schema": {"type": "string"}}},
                "headers": {
                    "X-Billing-Period": {
                        "description": "closed, or provisional while the period may still change",
                        "schema": {"type": "string", "enum": ["closed", "provisional"]},
                    }
                },
            },
            **answers(401, 403, 422, 503),
        },
    }


def _start(state: AppState, params: ExportParams) -> tuple[bytes, Iterator[bytes]]:
    chunks = export_chunks(state.sessions, params)
    # The first chunk runs the query, so a database outage answers 503 before any byte is sent.
    return next(chunks, b""), chunks


def _stream(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


async def export_response(request: Request, kind: Kind) -> StreamingResponse:
    """Check the query string (``parse_params``), then stream the export."""
    query = request.query_params
    params = parse_params(
        kind,
        query.get("since"),
        query.get("until"),
        query.get("group_by") if kind == "usage" else None,
        query.get("tz") if kind == "usage" else None,
        query.multi_items(),
        query.get("format"),
        query.get("customer_id") if kind == "usage" else None,
    )
    state = get_state(request)
    period = period_label(params, datetime.now(UTC), state.settings.close_lag_s)
    first, rest = await run_in_threadpool(_start, state, params)
    return StreamingResponse(
        _stream(first, rest),
        media_type=_CSV,
        headers={
            "X-Billing-Period": period,
            "Content-Disposition": f'attachment; filename="{params.kind}.csv"',
            "Cache-Control": "no-store",
        },
    )


@router.get(
    "/v1/exports/usage.csv",
    summary="Usage per group booked in [since, until), as CSV",
    **_route(UsageCsvParams, f"the group_by keys, then {','.join(USAGE_TOTAL_COLUMNS)}"),
)
async def usage_csv(request: Request) -> StreamingResponse:
    """One row per group (default ``day,api_key_id,model``): group columns, ``calls`` and the token
    totals, ``cost_usd``; ``X-Billing-Period: closed|provisional``. See ``billing.export``."""
    return await export_response(request, "usage")


@router.get(
    "/v1/exports/calls.csv",
    summary="Ledger entries booked in [since, until), as CSV",
    **_route(CallsCsvParams, ",".join(CALLS_COLUMNS)),
)
async def calls_csv(request: Request) -> StreamingResponse:
    """One row per ledger entry, by ``booked_at`` then ``entry_id``, with its prices and cost;
    ``X-Billing-Period: closed|provisional``. See ``billing.export``."""
    return await export_response(request, "calls")


_PERIOD = {
    "name": "period",
    "in": "query",
    "required": True,
    "schema": {"type": "string", "pattern": "^[0-9]{4}-(0[1-9]|1[0-2])$", "examples": ["2026-03"]},
    "description": "a UTC month",
}


async def _credits(request: Request) -> tuple[bytes, dict[str, Any]]:
    reader = QueryReader(request.query_params.multi_items(), ("period",))
    period = reader.text("period")
    reader.done()
    state = get_state(request)
    now = datetime.now(UTC)
    return await run_in_threadpool(
        export_credits, state.sessions, period, now, state.settings.close_lag_s
    )


@router.get(
    "/v1/exports/credits.csv",
    summary="Credit entries booked in a UTC month, as CSV",
    response_class=Response,
    dependencies=[Depends(allow("export"))],
    openapi_extra={"parameters": [_PERIOD]},
    responses={
        200: {
            "description": f"CSV with one header row: {','.join(CREDITS_COLUMNS)}",
            "content": {"text/csv": {"schema": {"type": "string"}}},
        },
        **answers(401, 403, 422, 503),
    },
)
async def credits_csv(request: Request) -> Response:
    """Grants, draws, reversals, expiries, voids and overdrafts booked in ``period``, by
    ``booked_at`` then ``entry_id``; ``X-Billing-Period: closed|provisional``."""
    body, manifest = await _credits(request)
    return Response(
        body,
        media_type=_CSV,
        headers={
            "X-Billing-Period": manifest["status"],
            "Content-Disposition": 'attachment; filename="credits.csv"',
            "Cache-Control": "no-store",
        },
    )


@router.get(
    "/v1/exports/credits.manifest.json",
    summary="The manifest of credits.csv for a UTC month: totals, SHA-256 and the identity",
    dependencies=[Depends(allow("export"))],
    openapi_extra={"parameters": [_PERIOD]},
    responses=answers(401, 403, 422, 503, ok={200: (CreditsManifest, "the manifest")}),
)
async def credits_manifest(request: Request) -> JSONResponse:
    """Σ grants − Σ draws − Σ expiries − Σ voids = Σ balances at the period's end, the
    period's own totals, the opening and closing balance, rows and the CSV's SHA-256."""
    return JSONResponse((await _credits(request))[1])
