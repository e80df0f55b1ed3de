"""``GET /v1/calls`` and ``GET /v1/calls/{request_id}`` (CONTRACT "Call log and usage queries")."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from billing.api.errors import error_responses
from billing.api.openapi import query_parameters
from billing.api.state import AppState, get_state, read
from billing.auth.guard import allow
from billing.calllog.queries import list_calls, parse_calls_query
from billing.calllog.schemas import CallDetail, CallsPage, CallsParams
from billing.calllog.service import get_call

router = APIRouter()


@router.get(
    "/v1/calls",
    summary="The call log, newest first, one page at a time",
    dependencies=[Depends(allow("read"))],
    responses={
        200: {"model": CallsPage, "description": "a page of calls"},
        **error_responses(
            401, 403, 422, 503, described={422: "an unknown, repeated or malformed parameter"}
        ),
    },
    openapi_extra=query_parameters(CallsParams),
)
async def calls(request: Request, state: Annotated[AppState, Depends(get_state)]) -> Response:
    """``{"data": [call, …], "next_cursor": …}``; pass ``next_cursor`` as ``cursor`` for the next
    page (null: no more calls now)."""
    query = parse_calls_query(request.query_params.multi_items())
    body = await read(state, lambda session: orjson.dumps(list_calls(session, query).as_json()))
    return Response(body, media_type="application/json")


@router.get(
    "/v1/calls/{request_id:path}",
    summary="One call with its events and ledger entries",
    dependencies=[Depends(allow("read"))],
    response_model=None,
    responses={
        200: {"model": CallDetail, "description": "the call"},
        **error_responses(401, 403, 404, 422, 503, described={404: "no such call"}),
    },
)
async def call_detail(
    request_id: str, state: Annotated[AppState, Depends(get_state)]
) -> dict[str, Any]:
    """The call object, its events in order and its ledger entries; 404 for an unknown call."""
    return await read(state, lambda session: get_call(session, request_id))
