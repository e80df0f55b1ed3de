"""``GET /v1/calls/{request_id}`` (CONTRACT "Call log and usage queries")."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from billing.api.state import AppState, get_state
from billing.calllog.service import get_call
from billing.storage.db import read_transaction

router = APIRouter()


def _read_call(state: AppState, request_id: str) -> dict[str, Any]:
    with read_transaction(state.sessions) as session:
        return get_call(session, request_id)


@router.get("/v1/calls/{request_id}", summary="One call with its events and ledger entries")
async def call_detail(
    request_id: str, state: Annotated[AppState, Depends(get_state)]
) -> dict[str, Any]:
    """The call object, its events in order and its ledger entries; 404 for an unknown call."""
    return await run_in_threadpool(_read_call, state, request_id)
