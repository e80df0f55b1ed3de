"""``POST /v1/plans`` and ``GET /v1/plans`` (CONTRACT "Keys, customers and plans (v2)")."""

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
from billing.plans.schemas import PlanIn, PlanList, PlanOut
from billing.plans.service import add_plan, list_plans
from billing.storage.db import write_transaction

router = APIRouter()


@router.post(
    "/v1/plans",
    summary="Add a plan version effective from a time",
    dependencies=[Depends(allow())],
    responses=answers(
        401,
        403,
        409,
        422,
        503,
        ok={
            200: (PlanOut, "the same plan version was already stored"),
            201: (PlanOut, "the plan version, stored"),
        },
        described={409: "a different version exists for this plan_id and effective_from"},
    ),
)
async def post_plan(plan: PlanIn, state: Annotated[AppState, Depends(get_state)]) -> JSONResponse:
    """201 with the stored version; 200 when the same one was already stored; 409 when a
    different one exists for the same ``plan_id`` and ``effective_from``."""
    now = datetime.now(UTC)

    def run() -> tuple[dict[str, object], bool]:
        with write_transaction(state.sessions) as session:
            return add_plan(session, plan, now)

    body, created = await run_in_threadpool(run)
    return JSONResponse(body, status_code=201 if created else 200)


@router.get(
    "/v1/plans",
    summary="List plan versions",
    dependencies=[Depends(allow("read", "export"))],
    responses=answers(401, 403, 422, 503, ok={200: (PlanList, "by plan, then effective_from")}),
)
async def get_plans(
    request: Request,
    state: Annotated[AppState, Depends(get_state)],
    plan_id: Annotated[str | None, Query(max_length=128, description="only this plan")] = None,
) -> JSONResponse:
    """``{"data": [plan, …]}`` by plan then ``effective_from``; 422 for an unknown or repeated
    query parameter."""
    problems = query_problems(request.query_params.multi_items(), ("plan_id",))
    if problems:
        raise ValidationFailed(problems)
    rows = await read(state, lambda session: list_plans(session, plan_id))
    return JSONResponse({"data": rows})
