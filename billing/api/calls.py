"""``GET /v1/calls`` and ``GET /v1/calls/{request_id}`` (CONTRACT "Call log and usage queries")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from billing.api.errors import answers
from billing.api.openapi import query_parameters
from billing.api.state import AppState, as_of_headers, get_state, routed, routed_json
from billing.auth.guard import allow
from billing.calllog.queries import list_calls, parse_calls_query
from billing.calllog.schemas import CallDetail, CallsPage, CallsParams
from billing.calllog.service import get_call

router = APIRouter()


@router.get(
    "/v1/calls",
    summary="The call log, newest first, one page at a time",
    dependencies=[Depends(allow("read"))],
    responses=answers(401, 403, 422, 503, ok={200: (CallsPage, "a page of calls")}),
    openapi_extra=query_parameters(CallsParams),
)
async def calls(request: Request, state: Annotated[AppState, Depends(get_state)]) -> Response:
    """``{"data": [call, …], "next_cursor": …}``; pass ``next_cursor`` as ``cursor`` for the next
    page (null: no more calls now). 422 for an unknown, repeated or malformed parameter."""
    query = parse_calls_query(request.query_params.multi_items())
    return await routed_json(state, lambda session: list_calls(session, query).as_json())


@router.get(
    "/v1/calls/{request_id:path}",
    summary="One call with its events and ledger entries",
    dependencies=[Depends(allow("read"))],
    responses=answers(401, 403, 404, 422, 503, ok={200: (CallDetail, "the call")}),
)
async def call_detail(
    request_id: str, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """The call object, its events in order and its ledger entries; 404 for an unknown call."""
    call, as_of = await routed(state, lambda session: get_call(session, request_id))
    return JSONResponse(call, headers=as_of_headers(as_of))
