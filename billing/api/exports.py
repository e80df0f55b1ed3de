"""``GET /v1/exports/usage.csv``, ``calls.csv`` (CONTRACT "Export") and ``focus.csv`` (v3)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from billing.api.errors import answers
from billing.api.openapi import query_parameters
from billing.api.state import as_of_headers, get_state, read_as_of
from billing.auth.guard import allow
from billing.calllog.params import QueryReader
from billing.credits.schemas import CreditsManifest
from billing.export.columns import CALLS_COLUMNS, USAGE_TOTAL_COLUMNS
from billing.export.credits import CREDITS_COLUMNS, export_credits
from billing.export.focus import FOCUS_COLUMNS, focus_chunks, parse_period
from billing.export.params import Kind, parse_params
from billing.export.schemas import CallsCsvParams, FocusCsvParams, UsageCsvParams
from billing.export.service import export_chunks, is_closed, period_label

router = APIRouter()

_CSV = "text/csv; charset=utf-8"
#: The ``as_of`` of a standby that has replayed nothing yet: every period is provisional.
_NEVER = datetime.min.replace(tzinfo=UTC)


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


def _first(
    reader: sessionmaker[Session], chunks_of: Callable[[sessionmaker[Session]], Iterator[bytes]]
) -> tuple[datetime | None, bytes, Iterator[bytes]]:
    """The ``as_of`` of the database the export reads (a replica, if any: read before the
    export's snapshot), and its first chunk."""
    as_of = read_as_of(reader)
    chunks = chunks_of(reader)
    # The first chunk runs the query, so a database outage answers 503 before any byte is sent.
    return as_of, next(chunks, b""), chunks


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
    as_of, first, rest = await run_in_threadpool(
        _first, state.reader, lambda reader: export_chunks(reader, params)
    )
    # Closed only once the database read holds every commit up to the period's close (a replica
    # that lags is provisional until it has replayed that far).
    period = period_label(params, as_of or _NEVER, state.settings.close_lag_s)
    return _csv(first, rest, period, params.kind, as_of)


def _csv(
    first: bytes, rest: Iterator[bytes], period: str, name: str, as_of: datetime | None
) -> StreamingResponse:
    return StreamingResponse(
        _stream(first, rest),
        media_type=_CSV,
        headers={
            **as_of_headers(as_of),
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
    as_of, first, rest = await run_in_threadpool(
        _first, state.reader, lambda reader: focus_chunks(reader, month)
    )
    closed = is_closed(month.until, as_of or _NEVER, state.settings.close_lag_s)
    return _csv(first, rest, "closed" if closed else "provisional", "focus", as_of)


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
