"""``GET /v1/usage`` (CONTRACT "Call log and usage queries")."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from billing.api.state import AppState, get_state
from billing.auth.guard import allow
from billing.calllog.usage import UsageQuery, parse_usage_query, usage_rows
from billing.storage.db import read_transaction

router = APIRouter()

_PARAMETERS = [
    ("since", True, "start of the period, RFC 3339 with an offset (inclusive)"),
    ("until", True, "end of the period, RFC 3339 with an offset (exclusive)"),
    ("api_key_id", False, "only this api key"),
    ("model", False, "only this model"),
    ("group_by", False, "comma list of api_key_id, model, hour, day, month"),
    ("tz", False, "IANA time zone where hours, days and months begin (default UTC)"),
    ("basis", False, "call_start (default: settled calls by start) or booked (the ledger)"),
]


def _read(state: AppState, query: UsageQuery) -> bytes:
    with read_transaction(state.sessions) as session:
        return orjson.dumps({"data": [row.as_json() for row in usage_rows(session, query)]})


@router.get(
    "/v1/usage",
    summary="Usage totals over a period, grouped",
    dependencies=[Depends(allow("read", "export"))],
    responses={422: {"description": "an unknown, repeated, missing or malformed parameter"}},
    openapi_extra={
        "parameters": [
            {
                "name": name,
                "in": "query",
                "required": required,
                "description": text,
                "schema": {"type": "string"},
            }
            for name, required, text in _PARAMETERS
        ]
    },
)
async def usage(request: Request, state: Annotated[AppState, Depends(get_state)]) -> Response:
    """``{"data": [row, …]}``: one row per non-empty group, ordered by the group-by keys."""
    query = parse_usage_query(request.query_params.multi_items())
    body = await run_in_threadpool(_read, state, query)
    return Response(body, media_type="application/json")
