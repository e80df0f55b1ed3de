"""``GET /v1/schema/events.json``: the JSON Schema of the events a gateway posts (CONTRACT
"Events"), for gateways written in other languages.

Any valid token may read it, whatever its role (``ingest`` included: the gateway's developers
are its readers); the contract names only ``/healthz``, ``/readyz`` and ``/metrics`` as open, so
with tokens configured it is not. Without tokens it is open on loopback, like every endpoint.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response

from billing.api.errors import answers
from billing.auth.guard import allow
from billing.ingest.schemas import EVENTS_SCHEMA_PATH, events_json_schema

router = APIRouter()


class SchemaResponse(JSONResponse):
    """JSON with the JSON Schema media type (RFC 8927's ``application/schema+json``)."""

    media_type = "application/schema+json"


@router.get(
    EVENTS_SCHEMA_PATH,
    summary="JSON Schema of the events",
    response_class=Response,
    dependencies=[Depends(allow("ingest", "read", "export"))],
    responses={
        200: {
            "description": "the JSON Schema of one event",
            "content": {"application/schema+json": {"schema": {"type": "object"}}},
        },
        **answers(401, 403, 503),
    },
)
def events_schema() -> SchemaResponse:
    """The JSON Schema (draft 2020-12) of one event: a ``oneOf`` the five types, discriminated
    by ``type``, with every field's type, bounds and whether it is required."""
    return SchemaResponse(events_json_schema())
