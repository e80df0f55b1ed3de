"""``GET /v1/usage`` (CONTRACT "Call log and usage queries")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from billing.api.errors import answers
from billing.api.openapi import query_parameters
from billing.api.state import AppState, get_state, routed_json
from billing.auth.guard import allow
from billing.calllog.schemas import UsagePage, UsageParams
from billing.calllog.usage import parse_usage_query, usage_rows

router = APIRouter()


@router.get(
    "/v1/usage",
    summary="Usage totals over a period, grouped",
    dependencies=[Depends(allow("read", "export"))],
    responses=answers(401, 403, 422, 503, ok={200: (UsagePage, "one row per non-empty group")}),
    openapi_extra=query_parameters(UsageParams),
)
async def usage(request: Request, state: Annotated[AppState, Depends(get_state)]) -> Response:
    """``{"data": [row, …]}``: one row per non-empty group, ordered by the group-by keys. 422 for
    an unknown, repeated, missing or malformed parameter."""
    query = parse_usage_query(request.query_params.multi_items())
    return await routed_json(
        state, lambda session: {"data": [r.as_json() for r in usage_rows(session, query)]}
    )
