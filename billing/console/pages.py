"""The console's v3 pages besides the Overview (CONTRACT "Observability and standard exports
(v3)"): **Keys** (``GET /v1/keys`` with each key's usage of the period), **Customers** (their
plans, budgets and charges of the period) and **Alerts** (``GET /v1/alerts``: each alert and
its webhook delivery). Each takes the session, the page's query string and the time.

Keys and Customers are paged by id (``KEYS_PER_PAGE``, ``CUSTOMERS_PER_PAGE``, a "next" link
as the call log's): the figures, keys and budget statuses are read for the page's ids only
(the rollup rows of those keys or customers), so a page costs the same at 10,000 keys."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from billing.budgets.service import customer_statuses, list_alerts
from billing.calllog.usage import UsageQuery, parse_usage_query, usage_rows
from billing.credits.service import decode_customer_cursor, list_customers
from billing.errors import FieldError, ValidationFailed
from billing.plans.service import decode_key_cursor, keys_in_force_of, list_keys

Items = Sequence[tuple[str, str]]
#: A page's builder: the session, the query string's pairs and the time → the context.
Build = Callable[[Session, Items, datetime], dict[str, Any]]
#: Keys a page shows (the next by the API's cursor).
KEYS_PER_PAGE = 100
#: Customers a page shows (the next by ``GET /v1/customers``' cursor).
CUSTOMERS_PER_PAGE = 100


def _cursor(items: Items, decode: Callable[[str], str]) -> str | None:
    """The id the page's ``cursor`` names (None: the first page); ``ValidationFailed``
    (the page shows the message) for a cursor no page gave."""
    text = dict(items).get("cursor")
    if text is None:
        return None
    try:
        return decode(text)
    except ValueError as bad:
        raise ValidationFailed([FieldError(None, "query.cursor", str(bad))]) from None


def _usage_of(
    session: Session, items: Items, key: str, values: Sequence[str]
) -> dict[Any, dict[str, Any]]:
    """``/v1/usage`` of the period grouped by ``key`` (``api_key_id`` or ``customer_id``) for
    these ``values`` only (one page's), by value: the rollup rows of those keys or customers
    (read by their index), not every one's."""
    query = parse_usage_query([(k, v) for k, v in items if k in ("since", "until")])
    ids = tuple(values)
    grouped = UsageQuery(
        query.since,
        query.until,
        group_by=(key,),
        api_key_ids=ids if key == "api_key_id" else None,
        customer_ids=ids if key == "customer_id" else None,
    )
    found = (row.as_json() for row in usage_rows(session, grouped))
    return {row[key]: row for row in found}


def keys_view(session: Session, items: Items, now: datetime) -> dict[str, Any]:
    """A page of keys (by id) with their customer, plan and the period's calls, cost and
    charge."""
    parse_usage_query([(k, v) for k, v in items if k in ("since", "until")])  # 422 first
    after = _cursor(items, decode_key_cursor)
    page, cursor = list_keys(session, after, KEYS_PER_PAGE, now)
    usage = _usage_of(session, items, "api_key_id", [key["api_key_id"] for key in page])
    return {"keys": [{**key, "usage": usage.get(key["api_key_id"])} for key in page],
            "next_cursor": cursor}  # fmt: skip


def customers_view(session: Session, items: Items, now: datetime) -> dict[str, Any]:
    """A page of customers (by id, as ``GET /v1/customers`` lists them: a record, a key or a
    grant): their plans and how many keys (of the keys' assignments in force), budgets in
    force scoped to each, the period's calls, cost and charge, and their prepaid credit now
    (``credit``: ``GET /v1/customers``' ``balance`` object, read for the page at once by
    ``list_customers``, as the Credits page reads it)."""
    parse_usage_query([(k, v) for k, v in items if k in ("since", "until")])  # 422 first
    after = _cursor(items, decode_customer_cursor)
    listed, cursor = list_customers(session, after, CUSTOMERS_PER_PAGE, now)
    ids = [c["customer_id"] for c in listed]
    credit = {c["customer_id"]: c["balance"] for c in listed}
    usage = _usage_of(session, items, "customer_id", ids)
    keys = keys_in_force_of(session, ids, now)
    budgets: dict[str, list[dict[str, Any]]] = {c: [] for c in ids}
    for status in customer_statuses(session, ids, now):
        budgets[status["scope"]["customer_id"]].append(status)
    rows = [
        {
            "customer_id": c,
            "plans": keys.get(c, (0, []))[1],
            "key_count": keys.get(c, (0, []))[0],
            "budgets": budgets[c],
            "usage": usage.get(c),
            "credit": credit[c],
        }
        for c in ids
    ]
    return {"customers": rows, "next_cursor": cursor}


def alerts_view(session: Session, items: Items, now: datetime) -> dict[str, Any]:
    """The alerts (newest first) with their webhook's delivery: state, attempts, the last
    answer or error."""
    del items, now
    return {"alerts": list(reversed(list_alerts(session, None, None)))}
