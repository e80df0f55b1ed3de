"""Rendering a console page: the Jinja2 environment (autoescaping every value) and the headers
every page carries (CONTRACT "Console (v2)": ``Content-Security-Policy: default-src 'self'``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape

from billing.console.people import count, percent, usd

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"

#: No script, style, image or frame from anywhere but this server, no inline script or style,
#: forms post only here, and no page of the console inside another site's frame.
CSP = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _query(params: dict[str, Any]) -> str:
    """``?a=1&b=2`` of the non-empty ``params`` ('' when none)."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return "?" + urlencode(kept) if kept else ""


ENV = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters["segment"] = lambda value: quote(str(value), safe="")
# A cost cell: "unpriced" where no price applied (None), else the value as it is.
ENV.filters["cost"] = lambda value: "unpriced" if value is None else value
ENV.globals["query"] = _query
ENV.globals["usd"] = usd
ENV.globals["percent"] = percent
ENV.globals["count"] = count
# A field name that may break after each underscore (``output_tokens_undelivered``), so that a
# table's header wraps instead of widening the table past the page.
# A long identifier (a key id may be 128 characters): cut to the cell's width with an ellipsis,
# the whole value in its ``title`` and in the text (copying it, or a search, gets all of it).
ENV.globals["ident"] = lambda value: Markup('<span class="ident" title="{0}">{0}</span>').format(
    "" if value is None else value
)
ENV.filters["breakable"] = lambda value: Markup("_<wbr>").join(
    escape(part) for part in str(value).split("_")
)
# What a page without a form or errors sees (a page's context overrides them).
ENV.globals.update(errors=[], invalid=False, form={})


def render(template: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    """``template`` rendered with ``context`` as an HTML response with the console's headers."""
    html = ENV.get_template(template).render(**context)
    return HTMLResponse(html, status_code=status, headers=HEADERS)


def page(template: str, context: dict[str, Any]) -> str:
    """``template`` rendered with ``context`` (for work done in the thread pool)."""
    return ENV.get_template(template).render(**context)


def respond(html: str, status: int = 200, extra: dict[str, str] | None = None) -> HTMLResponse:
    """An already rendered page as a response with the console's headers (and ``extra``)."""
    return HTMLResponse(html, status_code=status, headers={**HEADERS, **(extra or {})})
