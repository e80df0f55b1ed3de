"""``POST /v1/prices`` and ``GET /v1/prices`` (CONTRACT "Cost")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from billing.api.errors import answers
from billing.api.state import AppState, get_state, read
from billing.auth.guard import allow
from billing.calllog.params import query_problems
from billing.errors import ValidationFailed
from billing.pricing.prices import PriceVersion
from billing.pricing.schemas import PriceIn, PriceList, PriceOut
from billing.pricing.service import list_prices, record_price
from billing.storage.db import write_transaction

router = APIRouter()


def _post(state: AppState, price: PriceIn) -> tuple[PriceVersion, bool]:
    with write_transaction(state.sessions) as session:
        return record_price(session, price, datetime.now(UTC))


@router.post(
    "/v1/prices",
    summary="Add a model price effective from a time",
    dependencies=[Depends(allow())],
    responses=answers(
        401,
        403,
        409,
        422,
        503,
        ok={
            200: (PriceOut, "the same price was already stored"),
            201: (PriceOut, "the price, stored"),
        },
        described={409: "a different price exists for this model and effective_from"},
    ),
)
async def post_price(
    price: PriceIn, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """201 with the stored price; 200 when the same price was already stored; 409 when a
    different price exists for the same model, tier and ``effective_from``."""
    row, created = await run_in_threadpool(_post, state, price)
    return JSONResponse(row.as_json(), status_code=201 if created else 200)


@router.get(
    "/v1/prices",
    summary="List prices",
    dependencies=[Depends(allow("read"))],
    responses=answers(401, 403, 422, 503, ok={200: (PriceList, "by model, then effective_from")}),
)
async def get_prices(
    request: Request,
    state: Annotated[AppState, Depends(get_state)],
    model: Annotated[str | None, Query(max_length=256, description="only this model")] = None,
) -> JSONResponse:
    """``{"data": [price, …]}`` by model then ``effective_from``. An unknown or repeated query
    parameter is a 422 (as on the other queries): never a silently ignored filter."""
    problems = query_problems(request.query_params.multi_items(), ("model",))
    if problems:
        raise ValidationFailed(problems)
    rows = await read(state, lambda session: list_prices(session, model))
    return JSONResponse({"data": [row.as_json() for row in rows]})
