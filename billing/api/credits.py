"""``PUT/GET /v1/customers``, ``POST /v1/credits/grants`` (and ``…/void``), ``GET
/v1/credits/balance`` (CONTRACT "Prepaid credits (v3)")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from billing.api.errors import answers
from billing.api.state import AppState, get_state, read, read_single, write
from billing.auth.guard import allow
from billing.calllog.params import QueryReader
from billing.credits.rows import Owner
from billing.credits.schemas import (
    BalanceOut,
    CustomerIn,
    CustomerList,
    CustomerOut,
    GrantIn,
    GrantOut,
)
from billing.credits.service import (
    balance,
    decode_customer_cursor,
    get_customer,
    list_customers,
    post_grant,
    put_customer,
    void_grant,
)
from billing.errors import FieldError, ValidationFailed
from billing.plans.schemas import check_public_id

router = APIRouter()

#: Customers per page of ``GET /v1/customers`` by default, and at most.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


@router.put(
    "/v1/customers/{customer_id:path}",
    summary="Create or update a customer's credit settings",
    dependencies=[Depends(allow())],
    responses=answers(
        401,
        403,
        404,
        422,
        503,
        ok={200: (CustomerOut, "the customer, updated"), 201: (CustomerOut, "the new customer")},
    ),
)
async def put_one_customer(
    customer_id: str, body: CustomerIn, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """201 for a customer put the first time, 200 after."""
    cid = check_public_id(customer_id, "path.customer_id")
    now = datetime.now(UTC)
    answer, created = await write(state, lambda s, _now: put_customer(s, cid, body, now))
    return JSONResponse(answer, status_code=201 if created else 200)


@router.get(
    "/v1/customers",
    summary="The customers, by customer_id, one page at a time",
    dependencies=[Depends(allow("read"))],
    responses=answers(401, 403, 422, 503, ok={200: (CustomerList, "a page of customers")}),
)
async def get_customers(
    request: Request, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """``{"data": [customer, …], "next_cursor": …}``: those put and those named by keys or
    grants; pass ``next_cursor`` as ``cursor`` for the next page (null: the last)."""
    reader = QueryReader(request.query_params.multi_items(), ("limit", "cursor"))
    limit = reader.integer("limit", 1, MAX_LIMIT) or DEFAULT_LIMIT
    after = reader.parsed("cursor", decode_customer_cursor)
    reader.done()
    now = datetime.now(UTC)
    data, cursor = await read(state, lambda s: list_customers(s, after, limit, now))
    return JSONResponse({"data": data, "next_cursor": cursor})


@router.get(
    "/v1/customers/{customer_id:path}",
    summary="One customer: its settings and its balance",
    dependencies=[Depends(allow("read"))],
    responses=answers(401, 403, 404, 422, 503, ok={200: (CustomerOut, "the customer")}),
)
async def get_one_customer(
    customer_id: str, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """404 for a customer never put nor named by a key or a grant."""
    cid = check_public_id(customer_id, "path.customer_id")
    now = datetime.now(UTC)
    return JSONResponse(await read(state, lambda s: get_customer(s, cid, now)))


@router.post(
    "/v1/credits/grants",
    summary="Grant prepaid credit to a customer or a key",
    dependencies=[Depends(allow())],
    responses=answers(
        401,
        403,
        409,
        422,
        503,
        ok={201: (GrantOut, "the new grant"), 200: (GrantOut, "the same grant, stored before")},
        described={409: "a different grant with this grant_id exists"},
    ),
)
async def post_credit_grant(
    body: GrantIn, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """201 for a new grant; 200 for the same body again; 409 for another body."""
    now = datetime.now(UTC)
    answer, created = await write(state, lambda s, _now: post_grant(s, body, now))
    return JSONResponse(answer, status_code=201 if created else 200)


@router.post(
    "/v1/credits/grants/{grant_id:path}/void",
    summary="End what is left of a grant",
    dependencies=[Depends(allow())],
    responses=answers(401, 403, 404, 422, 503, ok={200: (GrantOut, "the grant, voided")}),
)
async def void_credit_grant(
    grant_id: str, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """The grant with ``state: "voided"`` and nothing left; repeating it changes nothing."""
    gid = check_public_id(grant_id, "path.grant_id")
    now = datetime.now(UTC)
    return JSONResponse(await write(state, lambda s, _now: void_grant(s, gid, now)))


@router.get(
    "/v1/credits/balance",
    summary="An owner's credit: balance, holds, pending, available, overdraft, grants",
    dependencies=[Depends(allow("read", "ingest"))],
    responses=answers(401, 403, 422, 503, ok={200: (BalanceOut, "the balance")}),
)
async def get_balance(
    request: Request, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """``?customer_id=`` or ``?api_key_id=`` (exactly one)."""
    return JSONResponse(await _balance(request, state))


#: The route answered by ``serve_balance`` ahead of the framework (``billing.api.direct``).
BALANCE_PATH = "/v1/credits/balance"

_allow_balance = allow("read", "ingest")


async def serve_balance(request: Request, state: AppState) -> dict[str, Any]:
    """``get_balance`` ahead of the framework (``billing.api.direct.serve``): the same guard,
    query and answer."""
    _allow_balance(request)
    return await _balance(request, state)


async def _balance(request: Request, state: AppState) -> dict[str, Any]:
    reader = QueryReader(request.query_params.multi_items(), ("customer_id", "api_key_id"))
    customer_id = reader.text("customer_id", 128)
    api_key_id = reader.text("api_key_id", 128)
    reader.done()
    if (customer_id is None) == (api_key_id is None):
        raise ValidationFailed(
            [FieldError(None, "query", "give exactly one of customer_id and api_key_id")]
        )
    owner = Owner(customer_id, api_key_id)
    now = datetime.now(UTC)
    # A customer's balance is one statement (``CoreCredits.balance_figures``); a key's reads
    # its customer first, the two in one snapshot.
    reading = read_single if customer_id is not None else read
    return await reading(state, lambda s: balance(s, owner, now))
