"""``GET /v1/schema/events.json``: the JSON Schema of the events a gateway posts (CONTRACT
"Events"), for gateways written in other languages.

Any valid token may read it, whatever its role (``ingest`` included: the gateway's developers
are its readers); the contract names only ``/healthz``, ``/readyz`` and ``/metrics`` as open, so
with tokens configured it is not. Without tokens it is open on loopback, like every endpoint.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from billing.auth.guard import allow
from billing.ingest.schemas import EVENTS_SCHEMA_PATH, events_json_schema

router = APIRouter()


@router.get(
    EVENTS_SCHEMA_PATH,
    summary="JSON Schema of the events",
    dependencies=[Depends(allow("ingest", "read", "export"))],
    responses={200: {"content": {"application/schema+json": {}}}},
)
def events_schema() -> JSONResponse:
    """The JSON Schema (draft 2020-12) of one event: a ``oneOf`` the five types, discriminated
    by ``type``, with every field's type, bounds and whether it is required."""
    return JSONResponse(events_json_schema(), media_type="application/schema+json")
