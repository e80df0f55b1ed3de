"""``GET /v1/exports/usage.csv``, ``calls.csv`` (CONTRACT "Export") and ``focus.csv`` (v3)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from billing.api.errors import answers
from billing.api.openapi import query_parameters
from billing.api.state import AppState, get_state
from billing.auth.guard import allow
from billing.export.columns import CALLS_COLUMNS, USAGE_TOTAL_COLUMNS
from billing.export.focus import FOCUS_COLUMNS, focus_chunks, parse_period
from billing.export.params import ExportParams, Kind, parse_params
from billing.export.schemas import CallsCsvParams, FocusCsvParams, UsageCsvParams
from billing.export.service import export_chunks, is_closed, period_label

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
    return _first(export_chunks(state.sessions, params))


def _first(chunks: Iterator[bytes]) -> tuple[bytes, Iterator[bytes]]:
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
    return _csv(first, rest, period, params.kind)


def _csv(first: bytes, rest: Iterator[bytes], period: str, name: str) -> StreamingResponse:
    return StreamingResponse(
        _stream(first, rest),
        media_type=_CSV,
        headers={
            "X-Billing-Period": period,
            "Content-Disposition": f'attachment; filename="{name}.csv"',
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


@router.get(
    "/v1/exports/focus.csv",
    summary="(v3) The ledger of a month in the FOCUS format, as CSV",
    **_route(FocusCsvParams, ",".join(FOCUS_COLUMNS)),
)
async def focus_csv(request: Request) -> StreamingResponse:
    """One row per ledger line booked in the month (UTC) and token class, in FOCUS 1.2
    columns; corrections of closed months as ``ChargeClass`` ``Correction``;
    ``X-Billing-Period: closed|provisional``. See ``billing.export.focus``."""
    query = request.query_params
    month = parse_period(query.get("period"), query.multi_items())
    state = get_state(request)
    closed = is_closed(month.until, datetime.now(UTC), state.settings.close_lag_s)
    first, rest = await run_in_threadpool(_first, focus_chunks(state.sessions, month))
    return _csv(first, rest, "closed" if closed else "provisional", "focus")
