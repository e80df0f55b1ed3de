"""``/healthz``, ``/readyz`` and ``/metrics`` (CONTRACT "Operations"); no token needed."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from billing.api.state import AppState, get_state
from billing.storage.disk import free_bytes
from billing.storage.migrate import current_revision, head_revision

router = APIRouter()


class Healthy(BaseModel):
    """The process serves."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["ok"]


class Ready(BaseModel):
    """The database is reachable and at the migration head."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["ready"]


class NotReady(BaseModel):
    """The database is unreachable, not at the migration head, or (SQLite) its disk is full;
    ``reason`` says which."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["not ready"]
    reason: str


@router.get(
    "/healthz",
    summary="The process is up",
    response_model=None,
    responses={200: {"model": Healthy, "description": "the process serves"}},
)
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
    free = free_bytes(state.engine)
    if free is not None and free < state.settings.min_free_disk_bytes:
        return False, (
            f"disk full: {free} bytes free beside the SQLite database, less than "
            f"BILLING_MIN_FREE_DISK_BYTES ({state.settings.min_free_disk_bytes}): writes fail"
        )
    return True, "ok"


@router.get(
    "/readyz",
    summary="Database reachable and at the migration head",
    responses={
        200: {"model": Ready, "description": "ready to serve"},
        503: {"model": NotReady, "description": "not ready, and why"},
    },
)
async def readyz(state: Annotated[AppState, Depends(get_state)]) -> JSONResponse:
    """200 ``{"status": "ready"}``, or 503 with the reason."""
    ready, reason = await run_in_threadpool(_readiness, state)
    if ready:
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
async def metrics(state: Annotated[AppState, Depends(get_state)]) -> Response:
    """Prometheus text format."""
    body = await run_in_threadpool(generate_latest, state.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
