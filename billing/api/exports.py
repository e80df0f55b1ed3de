"""``GET /v1/exports/usage.csv`` and ``GET /v1/exports/calls.csv`` (CONTRACT "Export")."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from billing.api.state import AppState, get_state
from billing.auth.guard import allow
from billing.export.params import ExportParams, Kind, parse_params
from billing.export.service import export_chunks, period_label

router = APIRouter()

_CSV = "text/csv; charset=utf-8"
_SINCE = Query(description="Start of the period (inclusive), RFC 3339 with offset.")
_UNTIL = Query(description="End of the period (exclusive), RFC 3339 with offset.")


def _start(state: AppState, params: ExportParams) -> tuple[bytes, Iterator[bytes]]:
    chunks = export_chunks(state.sessions, params)
    # The first chunk runs the query, so a database outage answers 503 before any byte is sent.
    return next(chunks, b""), chunks


def _stream(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


async def _respond(state: AppState, params: ExportParams) -> StreamingResponse:
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


async def _export(
    request: Request,
    kind: Kind,
    since: str | None,
    until: str | None,
    group_by: str | None = None,
    tz: str | None = None,
) -> StreamingResponse:
    query = request.query_params.multi_items()
    params = parse_params(kind, since, until, group_by, tz, query)
    return await _respond(get_state(request), params)


@router.get(
    "/v1/exports/usage.csv",
    summary="Usage per group booked in [since, until), as CSV",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/csv": {}}}, 422: {}},
    dependencies=[Depends(allow("export"))],
)
async def usage_csv(
    request: Request,
    since: Annotated[str | None, _SINCE] = None,
    until: Annotated[str | None, _UNTIL] = None,
    group_by: Annotated[
        str | None, Query(description="Comma list of api_key_id, model, hour, day, month.")
    ] = None,
    tz: Annotated[str | None, Query(description="IANA zone where buckets begin.")] = None,
) -> StreamingResponse:
    """One row per group (default ``day,api_key_id,model``): group columns, ``calls`` and the token
    totals, ``cost_usd``; ``X-Billing-Period: closed|provisional``. See ``billing.export``."""
    return await _export(request, "usage", since, until, group_by, tz)


@router.get(
    "/v1/exports/calls.csv",
    summary="Ledger entries booked in [since, until), as CSV",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/csv": {}}}, 422: {}},
    dependencies=[Depends(allow("export"))],
)
async def calls_csv(
    request: Request,
    since: Annotated[str | None, _SINCE] = None,
    until: Annotated[str | None, _UNTIL] = None,
) -> StreamingResponse:
    """One row per ledger entry, by ``booked_at`` then ``entry_id``, with its prices and cost;
    ``X-Billing-Period: closed|provisional``. See ``billing.export``."""
    return await _export(request, "calls", since, until)
