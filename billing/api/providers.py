"""``POST /v1/provider-reports`` (CONTRACT "Provider reports and drift")."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from billing.api.errors import answers
from billing.api.limits import admitted_body
from billing.api.openapi import request_body
from billing.api.state import AppState, get_state
from billing.auth.guard import allow
from billing.errors import FieldError, ValidationFailed
from billing.providers.schemas import ImportResult, ReportIn, parse_page
from billing.providers.service import import_buckets
from billing.storage.db import write_transaction

router = APIRouter()

PATH = "/v1/provider-reports"


def parse_report(body: bytes) -> ReportIn:
    """The body as ``ReportIn``, every number with a fraction read as ``Decimal`` from its
    text; ``ValidationFailed`` (422) for a body that is not such an object."""
    try:
        document = json.loads(body, parse_float=Decimal)
    except (ValueError, RecursionError) as error:
        raise ValidationFailed([FieldError(None, "body", f"is not valid JSON: {error}")]) from None
    try:
        return ReportIn.model_validate(document)
    except ValidationError as error:
        raise ValidationFailed(
            [
                FieldError(None, ".".join(map(str, ("body", *e["loc"]))), e["msg"])
                for e in error.errors(include_url=False)
            ]
        ) from None


def _import(state: AppState, body: bytes) -> ImportResult:
    report = parse_report(body)
    page = parse_page(report.provider, report.kind, report.report)
    with write_transaction(state.sessions) as session:
        return import_buckets(
            session, report.provider, report.kind, page.buckets, datetime.now(UTC)
        )


@router.post(
    PATH,
    summary="Store one page of a provider's usage or cost report",
    dependencies=[Depends(allow())],
    openapi_extra=request_body(ReportIn, "the provider, the kind and one page, verbatim"),
    responses=answers(
        401, 403, 413, 422, 503, ok={200: (ImportResult, "what the page changed, by bucket")}
    ),
)
async def post_provider_report(request: Request) -> JSONResponse:
    """``{"buckets", "new", "changed", "unchanged"}``; 422 naming the page expected when
    ``report`` is not a page of that provider's ``kind``."""
    state = get_state(request)
    body = admitted_body(request)
    result = await run_in_threadpool(_import, state, body)
    return JSONResponse(result.model_dump())
