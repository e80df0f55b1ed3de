"""``POST /v1/authorizations`` and ``DELETE /v1/authorizations/{request_id}`` (CONTRACT
"Authorizations and holds (v3)"): parse, call one ``billing.budgets.authorize`` function in a
write transaction (with the prepaid-credit check of ``billing.credits``), answer."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from billing.api.direct import ROUTE
from billing.api.errors import answers
from billing.api.limits import admitted_body
from billing.api.state import AppState, get_state, write
from billing.auth.guard import allow
from billing.budgets import authorize
from billing.budgets.schemas import AuthorizationIn, AuthorizationOut, HoldOut
from billing.credits.service import credit_gate

router = APIRouter()

#: The route answered by ``serve_authorization`` ahead of the framework (``billing.api.direct``).
PATH = "/v1/authorizations"
#: The release route (its path as the framework names it, the latency's label) and the prefix
#: of the paths ``serve_release`` answers ahead of the framework (the rest: the request id).
RELEASE_ROUTE = "/v1/authorizations/{request_id:path}"
RELEASE_PREFIX = "/v1/authorizations/"

_allow_ingest = allow("ingest")


@router.post(
    "/v1/authorizations",
    summary="Reserve an estimate against the budgets before calling the upstream",
    dependencies=[Depends(allow("ingest"))],
    responses=answers(
        401,
        403,
        409,
        422,
        503,
        ok={200: (AuthorizationOut, "allow (with the hold) or deny (with the reason)")},
        described={409: "this request_id was authorized with another body"},
    ),
)
async def post_authorization(
    body: AuthorizationIn, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """The decision; a repeated ``request_id`` with the same body gets the first answer and
    never holds twice."""
    return JSONResponse(await _decide(state, body))


async def _decide(state: AppState, body: AuthorizationIn) -> dict[str, Any]:
    return await write(state, lambda s, now: authorize.authorize(s, body, now, credit_gate))


async def serve_authorization(request: Request, state: AppState) -> Any:
    """``post_authorization`` ahead of the framework (``billing.api.direct.serve``): the same
    guard, body and answer. A body that is not JSON or that ``AuthorizationIn`` refuses is
    handed back (``ROUTE``): FastAPI's validation answers it, in its words (422)."""
    _allow_ingest(request)
    try:
        # As FastAPI reads a JSON body (the limits admitted only application/json): json.loads,
        # then the model's validation of the value.
        body = AuthorizationIn.model_validate(json.loads(admitted_body(request)))
    except (ValueError, TypeError, RecursionError):  # pydantic's ValidationError is a ValueError
        return ROUTE
    return await _decide(state, body)


@router.delete(
    "/v1/authorizations/{request_id:path}",
    summary="Release a hold (the gateway gave up before calling)",
    dependencies=[Depends(allow("ingest"))],
    responses=answers(401, 403, 404, 503, ok={200: (HoldOut, "the hold's state")}),
)
async def delete_authorization(
    request_id: str, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """``released`` (now or before), ``converted`` (its call has an event) or ``expired``;
    404 for an unknown ``request_id``."""
    return JSONResponse(await _release(state, request_id))


async def _release(state: AppState, request_id: str) -> dict[str, Any]:
    return await write(state, lambda s, now: authorize.release(s, request_id, now))


async def serve_release(request: Request, state: AppState) -> Any:
    """``delete_authorization`` ahead of the framework (``billing.api.direct.serve``): the same
    guard and answer; the request id is the (decoded) path after ``RELEASE_PREFIX``, as the
    route's ``path`` parameter takes it. An empty one is handed back (``ROUTE``)."""
    request_id = request.scope["path"][len(RELEASE_PREFIX) :]
    if not request_id:
        return ROUTE
    _allow_ingest(request)
    return await _release(state, request_id)
