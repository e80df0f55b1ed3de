"""``PUT/GET /v1/keys/{api_key_id}``, ``GET /v1/keys`` (CONTRACT "Keys, customers and plans
(v2)")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from billing.api.errors import answers
from billing.api.openapi import query_parameters
from billing.api.state import AppState, get_state, read
from billing.auth.guard import allow
from billing.calllog.params import QueryReader
from billing.plans.schemas import KeyIn, KeyList, KeyOut, KeysParams, check_key_id
from billing.plans.service import decode_key_cursor, get_key, list_keys, set_key
from billing.storage.db import write_transaction

router = APIRouter()

#: Keys per page of ``GET /v1/keys`` by default, and at most.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


@router.put(
    "/v1/keys/{api_key_id:path}",
    summary="Set a key's customer, plan and name from a time on",
    dependencies=[Depends(allow())],
    responses=answers(
        401,
        403,
        404,
        409,
        422,
        503,
        ok={
            200: (KeyOut, "the key (the same assignment was already stored)"),
            201: (KeyOut, "the key, with the new assignment"),
        },
        described={
            404: "no such route: the path's key id holds a line break",
            409: "a different assignment exists for this key and effective_from",
        },
    ),
)
async def put_key(
    api_key_id: str, key: KeyIn, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """201 with the key when the assignment is new, 200 when it was stored already; 409 for a
    different one at the same ``effective_from``; 422 for a ``plan_id`` no plan has."""
    key_id = check_key_id(api_key_id)
    now = datetime.now(UTC)

    def run() -> tuple[dict[str, object], bool]:
        with write_transaction(state.sessions) as session:
            return set_key(session, key_id, key, now)

    body, created = await run_in_threadpool(run)
    return JSONResponse(body, status_code=201 if created else 200)


@router.get(
    "/v1/keys",
    summary="The keys with an assignment, by api_key_id, one page at a time",
    dependencies=[Depends(allow("read", "export"))],
    responses=answers(401, 403, 422, 503, ok={200: (KeyList, "a page of keys")}),
    openapi_extra=query_parameters(KeysParams),
)
async def get_keys(
    request: Request, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """``{"data": [key, …], "next_cursor": …}``; pass ``next_cursor`` as ``cursor`` for the next
    page (null: the last). A key seen only in events has no assignment and is not listed."""
    reader = QueryReader(request.query_params.multi_items(), ("limit", "cursor"))
    limit = reader.integer("limit", 1, MAX_LIMIT) or DEFAULT_LIMIT
    after = reader.parsed("cursor", decode_key_cursor)
    reader.done()
    now = datetime.now(UTC)
    data, cursor = await read(state, lambda session: list_keys(session, after, limit, now))
    return JSONResponse({"data": data, "next_cursor": cursor})


@router.get(
    "/v1/keys/{api_key_id:path}",
    summary="One key: its customer, plan and name now, and their history",
    dependencies=[Depends(allow("read", "export"))],
    responses=answers(401, 403, 404, 422, 503, ok={200: (KeyOut, "the key")}),
)
async def get_one_key(
    api_key_id: str, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """The key; 404 for a key that has no assignment and that no call names."""
    key_id = check_key_id(api_key_id)
    now = datetime.now(UTC)
    return JSONResponse(await read(state, lambda session: get_key(session, key_id, now)))
