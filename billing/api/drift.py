"""``GET /v1/drift`` and ``GET /v1/exports/drift.csv`` (CONTRACT "Provider reports and drift")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from billing.api.errors import answers
from billing.api.openapi import query_parameters
from billing.api.state import AppState, as_of_headers, get_state, routed, routed_json
from billing.auth.guard import allow
from billing.drift.csv import drift_csv
from billing.drift.schemas import (
    CallDriftList,
    CallDriftParams,
    DriftList,
    DriftParams,
    parse_call_query,
    parse_query,
)
from billing.drift.service import call_drift, drift_rows

router = APIRouter()


@router.get(
    "/v1/drift",
    summary="Our calls against the providers' reports",
    dependencies=[Depends(allow("read", "export"))],
    openapi_extra=query_parameters(DriftParams),
    responses=answers(401, 403, 422, 503, ok={200: (DriftList, "mismatches first")}),
)
async def get_drift(request: Request, state: Annotated[AppState, Depends(get_state)]) -> Response:
    """``{"data": [row, …]}``; see ``billing.drift.service``."""
    query = parse_query(request.query_params.multi_items())
    return await routed_json(state, lambda session: {"data": drift_rows(session, query)})


@router.get(
    "/v1/drift/calls",
    summary="The calls whose provider-reported cost differs from ours",
    dependencies=[Depends(allow("read", "export"))],
    openapi_extra=query_parameters(CallDriftParams),
    responses=answers(401, 403, 422, 503, ok={200: (CallDriftList, "newest first, paged")}),
)
async def get_call_drift(
    request: Request, state: Annotated[AppState, Depends(get_state)]
) -> Response:
    """``{"data": [row, …], "next_cursor": …}``; see ``billing.drift.service.call_drift``."""
    query = parse_call_query(request.query_params.multi_items())
    return await routed_json(state, lambda session: call_drift(session, query))


@router.get(
    "/v1/exports/drift.csv",
    summary="The drift rows as CSV",
    dependencies=[Depends(allow("read", "export"))],
    openapi_extra=query_parameters(DriftParams),
    response_class=Response,
    responses={
        200: {
            "description": "CSV: the group keys, status, then ours_, theirs_, delta_ and "
            "delta_pct_ of each figure",
            "content": {"text/csv": {"schema": {"type": "string"}}},
        },
        **answers(401, 403, 422, 503),
    },
)
async def get_drift_csv(
    request: Request, state: Annotated[AppState, Depends(get_state)]
) -> Response:
    """The rows of ``/v1/drift`` for the same query, as CSV (``billing.drift.csv``)."""
    query = parse_query(request.query_params.multi_items())
    body, as_of = await routed(state, lambda session: drift_csv(query, drift_rows(session, query)))
    return Response(
        body,
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": 'attachment; filename="drift.csv"',
            "Cache-Control": "no-store",
            **as_of_headers(as_of),
        },
    )
