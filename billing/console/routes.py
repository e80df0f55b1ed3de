"""The console's pages (CONTRACT "Console (v2)"): thin handlers that check the viewer, read the
query string, build the page in one read transaction (``billing.console.views``) and render it.

Every page is a GET at its own URL with the API's parameter names; the only forms that change
anything (sign-in, sign-out) are POSTs from this site (``SameSite=Strict`` cookie, ``Origin``
checked). Pages a viewer's role may not see answer 403 in words; without a valid session the
pages send the browser to the sign-in page.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm import Session

from billing.api.exports import export_response
from billing.api.state import AppState, as_of_headers, get_state, routed
from billing.console import access, overview, pages, views
from billing.console.access import Viewer
from billing.console.render import page, render, respond
from billing.credits.rows import Owner
from billing.drift.schemas import CALL_QUERY_PARAMETERS, parse_call_query
from billing.drift.schemas import parse_query as parse_drift_query
from billing.drift.service import call_drift, drift_rows
from billing.errors import NotFound, ValidationFailed

router = APIRouter(prefix="/console", include_in_schema=False)

#: The longest form body taken (a token is about 50 characters); the request limits refuse a
#: longer one with 413 before it is read (``billing.api.limits``).
MAX_FORM_BYTES = 4096
#: The console's HTML form routes and their body limit (``billing.api.limits``'s ``form_paths``).
FORM_PATHS = {"/console/sign-in": MAX_FORM_BYTES, "/console/sign-out": MAX_FORM_BYTES}
_SIGN_IN = "/console/sign-in"


def _items(request: Request) -> list[tuple[str, str]]:
    """The query string's pairs without the empty ones (an empty form field means "any")."""
    return [(k, v) for k, v in request.query_params.multi_items() if v.strip()]


async def _gate(request: Request, page_name: str) -> Viewer | Response:
    """The viewer when they may see ``page_name``; else the answer: to the sign-in page (no
    valid session) or a 403 page naming the roles it needs."""
    viewer = await access.viewer_of(request)
    if viewer is None:
        return RedirectResponse(_SIGN_IN, status_code=303)
    if not viewer.may(page_name):
        roles = ", ".join(sorted(access.PAGE_ROLES[page_name] | {"admin"}))
        return render(
            "forbidden.html",
            {"viewer": viewer, "current": page_name, "roles": roles},
            status=403,
        )
    return viewer


async def _show(
    request: Request,
    viewer: Viewer,
    current: str,
    template: str,
    build: Callable[[Session], dict[str, Any]],
    form: dict[str, Any],
) -> Response:
    """``build(session)`` in a read transaction rendered with ``template``; its
    ``ValidationFailed`` shows the page's form with the messages (422), ``NotFound`` a 404."""
    state: AppState = get_state(request)
    base = {"viewer": viewer, "current": current, "form": form, "errors": [], **_choices()}

    def work(session: Session) -> tuple[str, int]:
        try:
            return page(template, {**base, **build(session)}), 200
        except ValidationFailed as failed:
            errors = [(e.path.removeprefix("query."), e.message) for e in failed.errors]
            return page(template, {**base, "errors": errors, "invalid": True}), 422
        except NotFound as missing:
            return page("not_found.html", {**base, "message": str(missing)}), 404

    (html, status), as_of = await routed(state, work)
    return respond(html, status, as_of_headers(as_of))


def _choices() -> dict[str, Any]:
    return {
        "statuses": views.STATUS_CHOICES,
        "bases": views.BASIS_CHOICES,
        "chart_periods": views.CHART_PERIODS,
        "usage_groups": views.USAGE_GROUPS,
        "zones": views.ZONES,
    }


@router.get("")
@router.get("/")
async def home(request: Request) -> Response:
    """To the first page the viewer may see (or to the sign-in page)."""
    viewer = await access.viewer_of(request)
    pages = viewer.pages() if viewer else []
    return RedirectResponse(f"/console/{pages[0][0]}" if pages else _SIGN_IN, status_code=303)


@router.get("/sign-in")
async def sign_in_form(request: Request) -> Response:
    """The sign-in form (a password field for the token)."""
    viewer = await access.viewer_of(request)
    return render("sign_in.html", {"viewer": viewer, "current": "sign-in", "message": None})


_CROSS_SITE = "This form may only be posted from this site."
_UNKNOWN = "That token is unknown or revoked; nothing was saved."


def _sign_in_page(message: str, status: int) -> Response:
    context = {"viewer": None, "current": "sign-in", "message": message}
    return render("sign_in.html", context, status)


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    """Check the pasted token; a known one goes into the session cookie (303 to the console),
    an unknown or revoked one is told so (401). The token is never echoed back."""
    if not access.same_origin(request):
        return _sign_in_page(_CROSS_SITE, 403)
    body = await request.body()
    fields = dict(parse_qsl(body.decode("utf-8", "replace")))
    token = fields.get("token", "").strip()
    role = await access.tokens(request).role_async(token) if token else None
    if role is None:
        return _sign_in_page("Paste a token." if not token else _UNKNOWN, 401)
    viewer = Viewer(role, open=False)
    pages = viewer.pages()
    target = f"/console/{pages[0][0]}" if pages else "/console/sign-in"
    response = RedirectResponse(target, status_code=303)
    access.set_session(request, response, token)
    return response


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    """Clear the session cookie and go back to the sign-in page."""
    if not access.same_origin(request):
        return _sign_in_page(_CROSS_SITE, 403)
    response = RedirectResponse(_SIGN_IN, status_code=303)
    access.clear_session(request, response)
    return response


@router.get("/overview")
async def overview_page(request: Request) -> Response:
    """The landing page (v3): the period against the one before, spend by model, top keys,
    customers and models, undelivered output, disconnects, errors, unpriced calls, budgets
    near their limit, failing webhooks (``billing.console.overview``). ``since``, ``until``
    and ``tz`` as ``/v1/usage`` reads them (the last 30 days of the zone by default); a bad or
    unknown parameter is named on the page (422), as the Usage page names it."""
    viewer = await _gate(request, "overview")
    if isinstance(viewer, Response):
        return viewer
    now = datetime.now(UTC)
    items = overview.overview_defaults(_items(request), now)
    return await _show(
        request,
        viewer,
        "overview",
        "overview.html",
        lambda s: overview.overview_view(
            s,
            items,
            now,
            budgets_shown=viewer.may("budgets"),
            alerts_shown=viewer.may("alerts"),
        ),
        dict(items),
    )


async def _period_page(request: Request, name: str, build: pages.Build) -> Response:
    """A v3 page of a period (``since`` / ``until``, the last 30 UTC days by default; a bound
    given is kept, so a bad one is named on the page)."""
    viewer = await _gate(request, name)
    if isinstance(viewer, Response):
        return viewer
    now = datetime.now(UTC)
    # (These pages take no zone: their period is read in UTC days, the given bounds kept.)
    given = [(k, v) for k, v in _items(request) if k in ("since", "until", "cursor")]
    items = overview.overview_defaults(given, now)
    return await _show(
        request, viewer, name, f"{name}.html", lambda s: build(s, items, now), dict(items)
    )


@router.get("/keys")
async def keys(request: Request) -> Response:
    """Keys with their customer, plan and usage of the period (v3)."""
    return await _period_page(request, "keys", pages.keys_view)


@router.get("/customers")
async def customers(request: Request) -> Response:
    """Customers: plans, keys, budgets and charges of the period (v3)."""
    return await _period_page(request, "customers", pages.customers_view)


@router.get("/alerts")
async def alerts(request: Request) -> Response:
    """Budget alerts and their webhook deliveries (v3)."""
    return await _period_page(request, "alerts", pages.alerts_view)


@router.get("/calls")
async def calls(request: Request) -> Response:
    """The call log (``GET /v1/calls``'s parameters), newest first, page by page."""
    viewer = await _gate(request, "calls")
    if isinstance(viewer, Response):
        return viewer
    items = _items(request)
    form = dict(items)
    return await _show(
        request, viewer, "calls", "calls.html", lambda s: views.calls_view(s, items), form
    )


@router.get("/calls/{request_id:path}")
async def call(request: Request, request_id: str) -> Response:
    """One call (``GET /v1/calls/{request_id}``): figures, output bar, timeline, ledger."""
    viewer = await _gate(request, "calls")
    if isinstance(viewer, Response):
        return viewer
    return await _show(
        request, viewer, "calls", "call.html", lambda s: views.call_view(s, request_id), {}
    )


@router.get("/usage")
async def usage(request: Request) -> Response:
    """Usage over time (``GET /v1/usage``'s parameters, by hour or day): charts and table."""
    viewer = await _gate(request, "usage")
    if isinstance(viewer, Response):
        return viewer
    items = views.usage_defaults(_items(request), datetime.now(UTC))
    form = dict(items)
    return await _show(
        request, viewer, "usage", "usage.html", lambda s: views.usage_view(s, items), form
    )


@router.get("/budgets")
async def budgets(request: Request) -> Response:
    """Budgets (``GET /v1/budgets/{id}`` for each in force, a page at a time): progress and
    state."""
    viewer = await _gate(request, "budgets")
    if isinstance(viewer, Response):
        return viewer
    now = datetime.now(UTC)
    items = _items(request)
    return await _show(
        request,
        viewer,
        "budgets",
        "budgets.html",
        lambda s: views.budgets_view(s, items, now),
        dict(items),
    )


@router.get("/credits")
async def credits(request: Request) -> Response:
    """Prepaid credits: the customers and their balances, or (``?customer_id=`` /
    ``?api_key_id=``) one owner's balance, grants and latest draws."""
    viewer = await _gate(request, "credits")
    if isinstance(viewer, Response):
        return viewer
    form = dict(_items(request))
    customer, key = form.get("customer_id"), form.get("api_key_id")
    owner = Owner.of(customer, key) if customer or key else None
    now = datetime.now(UTC)
    return await _show(
        request,
        viewer,
        "credits",
        "credits.html",
        lambda s: views.credits_view(s, owner, now),
        form,
    )


@router.get("/drift")
async def drift(request: Request) -> Response:
    """The drift table (``GET /v1/drift``'s parameters; the last 7 UTC days by default),
    mismatches first; then the first page of the calls whose provider-reported cost is not
    ours (``GET /v1/drift/calls``, newest first)."""
    viewer = await _gate(request, "drift")
    if isinstance(viewer, Response):
        return viewer
    items = views.period_defaults(_items(request), datetime.now(UTC), days=7)
    # (The per-call table: the first page of GET /v1/drift/calls for the same period.)
    per_call = [(name, value) for name, value in items if name in CALL_QUERY_PARAMETERS]
    return await _show(
        request,
        viewer,
        "drift",
        "drift.html",
        lambda s: views.drift_view(
            drift_rows(s, parse_drift_query(items)), call_drift(s, parse_call_query(per_call))
        ),
        dict(items),
    )


@router.get("/exports")
async def exports(request: Request) -> Response:
    """Download links for a period (the exports' parameters; yesterday in UTC by default)."""
    viewer = await _gate(request, "exports")
    if isinstance(viewer, Response):
        return viewer
    now = datetime.now(UTC)
    items = views.period_defaults(_items(request), now, days=1)
    lag = get_state(request).settings.close_lag_s
    return await _show(
        request,
        viewer,
        "exports",
        "exports.html",
        lambda _session: views.exports_view(items, now, lag),
        dict(items),
    )


@router.get("/exports/usage.csv")
async def usage_csv(request: Request) -> Response:
    """``GET /v1/exports/usage.csv``'s bytes for a signed-in viewer (the cookie stands for the
    bearer token a browser link cannot send)."""
    viewer = await _gate(request, "exports")
    if isinstance(viewer, Response):
        return viewer
    return await export_response(request, "usage")


@router.get("/exports/calls.csv")
async def calls_csv(request: Request) -> Response:
    """``GET /v1/exports/calls.csv``'s bytes for a signed-in viewer."""
    viewer = await _gate(request, "exports")
    if isinstance(viewer, Response):
        return viewer
    return await export_response(request, "calls")
