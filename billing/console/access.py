"""Who is looking at the console: the token in the session cookie and its role.

Source: CONTRACT "Console (v2)" and "Who may do what". The token pasted at sign-in travels in the
``billing_console`` cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` when the request came by
HTTPS, path ``/console``); it is never put in a URL or a page. While no token exists the console is
open, as the API is (``billing serve`` then listens on loopback only). A page needs the roles of
the API it shows (``PAGE_ROLES``); ``admin`` may see every page.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request, Response

from billing.auth.guard import TokenCache

COOKIE = "billing_console"
COOKIE_PATH = "/console"
#: The roles each page needs besides ``admin``: those of the API endpoint it shows.
PAGE_ROLES: dict[str, frozenset[str]] = {
    "overview": frozenset({"read", "export"}),  # GET /v1/usage (and the budgets' states)
    "calls": frozenset({"read"}),  # GET /v1/calls, /v1/calls/{id}
    "usage": frozenset({"read", "export"}),  # GET /v1/usage
    "budgets": frozenset({"read"}),  # GET /v1/budgets/{id}
    "credits": frozenset({"read"}),  # GET /v1/customers, /v1/credits/balance
    "drift": frozenset({"read", "export"}),  # GET /v1/drift
    "exports": frozenset({"export"}),  # GET /v1/exports/*
    "customers": frozenset({"read"}),  # GET /v1/keys, /v1/usage, budgets
    "keys": frozenset({"read"}),  # GET /v1/keys, /v1/usage
    "alerts": frozenset({"read"}),  # GET /v1/alerts
}
#: The pages in the order of the navigation, with their titles.
PAGES: tuple[tuple[str, str], ...] = (
    ("overview", "Overview"),
    ("calls", "Calls"),
    ("usage", "Usage"),
    ("budgets", "Budgets"),
    ("credits", "Credits"),
    ("drift", "Drift"),
    ("exports", "Exports"),
    ("customers", "Customers"),
    ("keys", "Keys"),
    ("alerts", "Alerts"),
)


@dataclass(frozen=True)
class Viewer:
    """The one looking: ``role`` (``admin`` while the console is open), and whether the console
    is ``open`` (no token exists) or they signed in."""

    role: str
    open: bool

    def may(self, page: str) -> bool:
        """Whether this viewer may see ``page`` (a key of ``PAGE_ROLES``)."""
        return self.role == "admin" or self.role in PAGE_ROLES[page]

    def pages(self) -> list[tuple[str, str]]:
        """The (page, title) pairs of the navigation this viewer may follow."""
        return [(page, title) for page, title in PAGES if self.may(page)]


def tokens(request: Request) -> TokenCache:
    """The app's token cache (``billing.auth.guard``)."""
    cache: TokenCache = request.app.state.tokens
    return cache


async def viewer_of(request: Request) -> Viewer | None:
    """The viewer of ``request``; None when tokens exist and the cookie holds no valid one."""
    cache = tokens(request)
    if not await cache.auth_enabled_async():
        return Viewer("admin", open=True)
    presented = request.cookies.get(COOKIE, "").strip()
    if not presented:
        return None
    role = await cache.role_async(presented)
    return None if role is None else Viewer(role, open=False)


def set_session(request: Request, response: Response, token: str) -> None:
    """Put ``token`` in the session cookie of ``response``."""
    response.set_cookie(
        COOKIE,
        token,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )


def _secure(request: Request) -> bool:
    """Whether the cookie is ``Secure``: always with ``BILLING_COOKIE_SECURE=true``, else when
    the client's scheme is https (behind a trusted proxy: its ``X-Forwarded-Proto``, which
    uvicorn applies for ``billing serve --forwarded-allow-ips``)."""
    return bool(request.app.state.billing.settings.cookie_secure) or request.url.scheme == "https"


def clear_session(request: Request, response: Response) -> None:
    """Expire the session cookie (same name, path and flags as when it was set)."""
    response.delete_cookie(
        COOKIE,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )


def same_origin(request: Request) -> bool:
    """Whether a form post comes from this site: its ``Origin`` (or, without one, ``Referer``)
    names this host, or the browser sent neither. With the ``SameSite=Strict`` cookie this keeps
    other sites from signing a browser in or out."""
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    if origin is not None:
        return origin != "null" and urlsplit(origin).netloc == host
    referer = request.headers.get("referer")
    return referer is None or urlsplit(referer).netloc == host
