"""Fetching report pages from the providers' admin APIs (``billing providers pull``).

A real HTTP client (httpx): one GET per page, following ``next_page`` while ``has_more``;
429 and 5xx answers (and connection failures) are retried, after the ``Retry-After`` seconds
the provider asks for, else after 1, 2, 4, … seconds, up to ``attempts`` tries. The admin key
comes from the environment only (``OPENAI_ADMIN_KEY`` / ``ANTHROPIC_ADMIN_KEY``), goes in a
request header and nowhere else: never in a URL, a log line, an error or the output.

Requests (each provider's API reference):

- OpenAI ``GET /v1/organization/usage/completions`` and ``/v1/organization/costs`` with
  ``start_time`` / ``end_time`` (Unix seconds), ``bucket_width``, ``group_by`` (repeated),
  ``limit``, ``page``; ``Authorization: Bearer <key>``.
- Anthropic ``GET /v1/organizations/usage_report/messages`` and ``/v1/organizations/cost_report``
  with ``starting_at`` / ``ending_at`` (RFC 3339), ``bucket_width``, ``group_by[]``, ``limit``,
  ``page``; ``x-api-key: <key>`` and ``anthropic-version``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import httpx

from billing.providers.schemas import ENDPOINTS, ReportPage, parse_page

log = logging.getLogger("billing.providers.pull")

#: Where each provider's admin key is read from.
KEY_VARIABLES = {"openai": "OPENAI_ADMIN_KEY", "anthropic": "ANTHROPIC_ADMIN_KEY"}
BASE_URLS = {"openai": "https://api.openai.com", "anthropic": "https://api.anthropic.com"}
ANTHROPIC_VERSION = "2023-06-01"
#: The most buckets a page may hold, per bucket width (both providers' limits).
_LIMITS = {"1d": 31, "1h": 168}
#: The upstream account to group by: the API key, or the project (OpenAI) / workspace
#: (Anthropic), which is what cost reports can be grouped by.
_GROUP_BY = {
    ("openai", "usage", "key"): ("model", "api_key_id", "service_tier"),
    ("openai", "usage", "project"): ("model", "project_id", "service_tier"),
    ("openai", "cost", "key"): ("line_item", "project_id"),
    ("openai", "cost", "project"): ("line_item", "project_id"),
    ("anthropic", "usage", "key"): ("model", "api_key_id", "service_tier"),
    ("anthropic", "usage", "project"): ("model", "workspace_id", "service_tier"),
    ("anthropic", "cost", "key"): ("workspace_id", "description"),
    ("anthropic", "cost", "project"): ("workspace_id", "description"),
}


class PullError(Exception):
    """The provider could not be read (a refused key, an answer that is not a page, retries
    exhausted); the message never holds the key."""


@dataclass(frozen=True)
class PullRequest:
    """What to fetch: ``[since, until)`` of ``provider``'s ``kind`` report."""

    provider: str
    kind: str
    since: datetime
    until: datetime
    bucket_width: str = "1d"
    account: str = "project"
    base_url: str | None = None


_Params = list[tuple[str, str | int | float | bool | None]]


def _params(request: PullRequest, page: str | None) -> _Params:
    group_by = _GROUP_BY[(request.provider, request.kind, request.account)]
    limit = str(_LIMITS[request.bucket_width])
    params: _Params
    if request.provider == "openai":
        params = [
            ("start_time", str(int(request.since.timestamp()))),
            ("end_time", str(int(request.until.timestamp()))),
            ("bucket_width", request.bucket_width),
            ("limit", limit),
            *(("group_by", name) for name in group_by),
        ]
    else:
        params = [
            ("starting_at", request.since.isoformat().replace("+00:00", "Z")),
            ("ending_at", request.until.isoformat().replace("+00:00", "Z")),
            ("bucket_width", request.bucket_width),
            ("limit", limit),
            *(("group_by[]", name) for name in group_by),
        ]
    if page is not None:
        params.append(("page", page))
    return params


def _headers(provider: str, key: str) -> dict[str, str]:
    if provider == "openai":
        return {"Authorization": f"Bearer {key}"}
    return {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION}


def _wait_s(response: httpx.Response | None, attempt: int) -> float:
    header = response.headers.get("retry-after") if response is not None else None
    if header is not None:
        try:
            return min(max(float(header), 0.0), 300.0)
        except ValueError:
            pass  # an HTTP date: fall back to the backoff
    return float(min(2 ** (attempt - 1), 60))


def fetch_pages(
    request: PullRequest,
    key: str,
    *,
    attempts: int = 6,
    timeout_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[tuple[dict[str, Any], ReportPage]]:
    """Each page of the report in order, as (the page as parsed JSON, parsed), until the last.

    Raises ``PullError`` for a non-retryable answer (401, 403, 400…), an answer that is not a
    page of the expected shape, or when ``attempts`` tries of one page all failed."""
    base = (request.base_url or BASE_URLS[request.provider]).rstrip("/")
    url = base + ENDPOINTS[(request.provider, request.kind)]
    page: str | None = None
    seen: set[str] = set()
    with httpx.Client(headers=_headers(request.provider, key), timeout=timeout_s) as client:
        while True:
            document = _get(client, url, _params(request, page), attempts, sleep)
            parsed = parse_page(request.provider, request.kind, document)
            yield document, parsed
            page = parsed.next_page
            if page is None:
                return
            if page in seen:
                raise PullError(f"{url} answered the same next_page twice; stopped")
            seen.add(page)


def _get(
    client: httpx.Client,
    url: str,
    params: _Params,
    attempts: int,
    sleep: Callable[[float], None],
) -> Any:
    for attempt in range(1, attempts + 1):
        response: httpx.Response | None = None
        try:
            response = client.get(url, params=params)
        except httpx.TransportError as error:
            problem = f"{type(error).__name__}"
        else:
            if response.status_code == 200:
                try:
                    return json.loads(response.content, parse_float=Decimal)
                except ValueError:
                    raise PullError(f"{url} answered 200 with a body that is not JSON") from None
            if response.status_code != 429 and response.status_code < 500:
                raise PullError(
                    f"{url} answered {response.status_code}"
                    + (" (is the admin key right?)" if response.status_code in (401, 403) else "")
                )
            problem = f"HTTP {response.status_code}"
        if attempt == attempts:
            break
        wait = _wait_s(response, attempt)
        log.warning("%s: %s; retry %d in %.1f s", url, problem, attempt, wait)
        sleep(wait)
    raise PullError(f"{url}: no answer after {attempts} tries ({problem})")
