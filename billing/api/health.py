"""``/healthz``, ``/readyz`` and ``/metrics`` (CONTRACT "Operations"); no token needed."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from billing.api.state import AppState, get_state
from billing.storage.migrate import current_revision, head_revision

router = APIRouter()


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    """Always ``{"status": "ok"}`` while the process serves."""
    return {"status": "ok"}


def _readiness(state: AppState) -> tuple[bool, str]:
    try:
        current = current_revision(state.engine)
    except SQLAlchemyError as error:
        return False, f"database unreachable ({type(error).__name__})"
    head = head_revision()
    if current != head:
        return False, f"database at migration {current}, head is {head}: run `billing migrate`"
    return True, "ok"


@router.get("/readyz", summary="Database reachable and at the migration head")
async def readyz(state: Annotated[AppState, Depends(get_state)]) -> JSONResponse:
    """200 ``{"status": "ready"}``, or 503 with the reason."""
    ready, reason = await run_in_threadpool(_readiness, state)
    if ready:
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(state: Annotated[AppState, Depends(get_state)]) -> Response:
    """Prometheus text format."""
    body = await run_in_threadpool(generate_latest, state.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
