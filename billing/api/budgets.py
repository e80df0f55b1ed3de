"""``/v1/budgets``, ``GET /v1/spend`` and ``GET /v1/alerts`` (CONTRACT "Budgets and alerts
(v2)"): parse, call one ``billing.budgets.service`` function, answer."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from billing.api.errors import answers
from billing.api.state import AppState, get_state, read, write
from billing.auth.guard import allow
from billing.budgets import service
from billing.budgets.schemas import (
    AlertList,
    BudgetChange,
    BudgetIn,
    BudgetList,
    BudgetOut,
    BudgetStatus,
    SpendCheck,
)
from billing.calllog.params import QueryReader, parse_timestamp, query_problems
from billing.errors import ValidationFailed

router = APIRouter()
# DELETE is declared last: the access matrix (tests/auth) calls the routes in this order.


def _known(request: Request, *names: str) -> None:
    problems = query_problems(request.query_params.multi_items(), names)
    if problems:
        raise ValidationFailed(problems)


@router.post(
    "/v1/budgets",
    summary="Create a budget over a key or a customer",
    dependencies=[Depends(allow())],
    responses=answers(
        401,
        403,
        409,
        422,
        503,
        ok={201: (BudgetOut, "the budget, with its webhook_secret (shown this once)")},
        described={409: "a budget with this budget_id exists or existed"},
    ),
    status_code=201,
)
async def post_budget(
    body: BudgetIn, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """201 with the budget and, this once, its ``webhook_secret`` (``whsec_…``); 409 when the id
    is taken; 422 naming the field for a bad limit, time zone, thresholds or URL."""
    out = await write(state, lambda s, now: service.create_budget(s, body, now))
    return JSONResponse(out, status_code=201)


@router.put(
    "/v1/budgets/{budget_id:path}",
    summary="Change a budget (a new version; the history stays)",
    dependencies=[Depends(allow())],
    responses=answers(401, 403, 404, 422, 503, ok={200: (BudgetOut, "the new version")}),
)
async def put_budget(
    budget_id: str, body: BudgetChange, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """The whole budget as POST takes it (without ``budget_id``); 404 for an unknown or deleted
    budget. Its current period's counter is filled again for the new definition."""
    return JSONResponse(
        await write(state, lambda s, now: service.update_budget(s, budget_id, body, now))
    )


@router.get(
    "/v1/budgets",
    summary="List the budgets",
    dependencies=[Depends(allow("read"))],
    responses=answers(401, 403, 422, 503, ok={200: (BudgetList, "by budget_id")}),
)
async def get_budgets(
    request: Request,
    state: Annotated[AppState, Depends(get_state)],
    include_ended: Annotated[bool, Query(description="also the deleted ones")] = False,
) -> JSONResponse:
    """``{"data": [budget, …]}`` by ``budget_id`` (no secrets)."""
    _known(request, "include_ended")
    data = await read(state, lambda s: service.list_budgets(s, include_ended))
    return JSONResponse({"data": data})


@router.get(
    "/v1/budgets/{budget_id:path}",
    summary="A budget's spend in its current period",
    dependencies=[Depends(allow("read"))],
    responses=answers(401, 403, 404, 503, ok={200: (BudgetStatus, "the status")}),
)
async def get_budget(
    budget_id: str, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """Settled and provisional spend, remaining, ``fraction_used`` and ``state``."""
    now = datetime.now(UTC)
    return JSONResponse(await read(state, lambda s: service.budget_status(s, budget_id, now)))


@router.get(
    "/v1/spend",
    summary="The gateway's pre-call check: may this key spend?",
    dependencies=[Depends(allow("ingest", "read"))],
    responses=answers(401, 403, 422, 503, ok={200: (SpendCheck, "the key's budgets")}),
)
async def get_spend(
    request: Request,
    state: Annotated[AppState, Depends(get_state)],
    api_key_id: Annotated[str, Query(min_length=1, max_length=128)],
) -> JSONResponse:
    """``allowed`` is false when any budget over the key or its customer is exceeded."""
    _known(request, "api_key_id")
    now = datetime.now(UTC)
    check = await read(state, lambda s: service.spend_check(s, api_key_id, now))
    return JSONResponse(check)


@router.get(
    "/v1/alerts",
    summary="Budget alerts with their webhook delivery state",
    dependencies=[Depends(allow("read"))],
    responses=answers(401, 403, 422, 503, ok={200: (AlertList, "oldest first")}),
)
async def get_alerts(
    request: Request,
    state: Annotated[AppState, Depends(get_state)],
    budget_id: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    since: Annotated[
        str | None,
        Query(
            description="RFC 3339 with offset: alerts made at or after",
            json_schema_extra={"format": "date-time"},
        ),
    ] = None,
) -> JSONResponse:
    """``{"data": [alert, …]}`` oldest first, at most 1000. ``since`` is read as every query
    endpoint reads a timestamp (``billing.calllog.params.parse_timestamp``)."""
    reader = QueryReader(request.query_params.multi_items(), ("budget_id", "since"))
    after = reader.parsed("since", parse_timestamp)
    reader.done()
    data = await read(state, lambda s: service.list_alerts(s, budget_id, after))
    return JSONResponse({"data": data})


@router.delete(
    "/v1/budgets/{budget_id:path}",
    summary="End a budget (its history stays)",
    dependencies=[Depends(allow())],
    responses=answers(401, 403, 404, 503, ok={200: (BudgetOut, "the ended budget")}),
)
async def delete_budget(
    budget_id: str, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """The budget with its ``ended_at``; 404 for an unknown or already deleted budget."""
    return JSONResponse(await write(state, lambda s, now: service.delete_budget(s, budget_id, now)))
