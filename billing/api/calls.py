"""``GET /v1/calls`` and ``GET /v1/calls/{request_id}`` (CONTRACT "Call log and usage queries")."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from billing.api.state import AppState, get_state
from billing.auth.guard import allow
from billing.calllog.queries import CallsQuery, list_calls, parse_calls_query
from billing.calllog.service import get_call
from billing.storage.db import read_transaction

router = APIRouter()

_PARAMETERS = [
    ("api_key_id", "only calls of this api key"),
    ("model", "only calls of this model"),
    ("status", "only calls in this status: open, completed, client_disconnected, failed"),
    ("since", "calls started at or after this instant (RFC 3339 with an offset)"),
    ("until", "calls started before this instant (RFC 3339 with an offset)"),
    ("limit", "calls per page, 1 to 1000 (default 100)"),
    ("cursor", "next_cursor of the previous page"),
]


def _list(state: AppState, query: CallsQuery) -> bytes:
    with read_transaction(state.sessions) as session:
        return orjson.dumps(list_calls(session, query).as_json())


@router.get(
    "/v1/calls",
    summary="The call log, newest first, one page at a time",
    dependencies=[Depends(allow("read"))],
    responses={422: {"description": "an unknown, repeated or malformed parameter"}},
    openapi_extra={
        "parameters": [
            {
                "name": name,
                "in": "query",
                "required": False,
                "description": text,
                "schema": {"type": "string"},
            }
            for name, text in _PARAMETERS
        ]
    },
)
async def calls(request: Request, state: Annotated[AppState, Depends(get_state)]) -> Response:
    """``{"data": [call, …], "next_cursor": …}``; pass ``next_cursor`` as ``cursor`` for the next
    page (null: no more calls now)."""
    query = parse_calls_query(request.query_params.multi_items())
    body = await run_in_threadpool(_list, state, query)
    return Response(body, media_type="application/json")


def _read_call(state: AppState, request_id: str) -> dict[str, Any]:
    with read_transaction(state.sessions) as session:
        return get_call(session, request_id)


@router.get(
    "/v1/calls/{request_id:path}",
    summary="One call with its events and ledger entries",
    dependencies=[Depends(allow("read"))],
)
async def call_detail(
    request_id: str, state: Annotated[AppState, Depends(get_state)]
) -> dict[str, Any]:
    """The call object, its events in order and its ledger entries; 404 for an unknown call."""
    return await run_in_threadpool(_read_call, state, request_id)
