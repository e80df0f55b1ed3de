"""``POST /v1/reconcile``: one reconciliation pass now (CONTRACT "Cost")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from billing.api.errors import answers
from billing.api.state import AppState, get_state
from billing.auth.guard import allow
from billing.reconcile.runner import run_pass
from billing.reconcile.schemas import PassReply

router = APIRouter()


@router.post(
    "/v1/reconcile",
    summary="Run one reconciliation pass now",
    dependencies=[Depends(allow())],
    responses=answers(401, 403, 503),
)
async def reconcile_now(state: Annotated[AppState, Depends(get_state)]) -> PassReply:
    """Settles what is due and books adjustments for late events; answers what it did."""
    result = await run_in_threadpool(run_pass, state.sessions, state.settings, state.metrics)
    return PassReply(examined=result.examined, settled=result.settled, adjusted=result.adjusted)
