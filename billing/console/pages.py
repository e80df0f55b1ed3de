"""The console's v3 pages besides the Overview (CONTRACT "Observability and standard exports
(v3)"): **Keys** (``GET /v1/keys`` with each key's usage of the period), **Customers** (their
plans, budgets and charges of the period) and **Alerts** (``GET /v1/alerts``: each alert and
its webhook delivery). Each takes the session, the page's query string and the time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from billing.budgets.service import list_alerts, statuses_in_force
from billing.calllog.usage import UsageQuery, parse_usage_query, usage_rows
from billing.plans.service import list_keys

Items = Sequence[tuple[str, str]]
#: A page's builder: the session, the query string's pairs and the time → the context.
Build = Callable[[Session, Items, datetime], dict[str, Any]]
#: Keys a page shows (the next by the API's cursor).
KEYS_PER_PAGE = 100
#: Keys read to name each customer's plans and keys.
MAX_KEYS_READ = 1000


def _by(session: Session, items: Items, key: str) -> dict[Any, dict[str, Any]]:
    """``/v1/usage`` of the period grouped by ``key``, by its value."""
    query = parse_usage_query([(k, v) for k, v in items if k in ("since", "until")])
    grouped = UsageQuery(query.since, query.until, group_by=(key,))
    return {row.as_json()[key]: row.as_json() for row in usage_rows(session, grouped)}


def keys_view(session: Session, items: Items, now: datetime) -> dict[str, Any]:
    """A page of keys (by id) with their customer, plan and the period's calls, cost and
    charge."""
    usage = _by(session, items, "api_key_id")
    after = dict(items).get("cursor")
    page, cursor = list_keys(session, after, KEYS_PER_PAGE, now)
    return {"keys": [{**key, "usage": usage.get(key["api_key_id"])} for key in page],
            "next_cursor": cursor}  # fmt: skip


def customers_view(session: Session, items: Items, now: datetime) -> dict[str, Any]:
    """Each customer with a key or with usage in the period: plans and keys (their keys in
    force), budgets in force scoped to it, and the period's calls, cost and charge."""
    usage = _by(session, items, "customer_id")
    keys, _ = list_keys(session, None, MAX_KEYS_READ, now)
    customers: dict[str, dict[str, Any]] = {}

    def entry(customer_id: str) -> dict[str, Any]:
        return customers.setdefault(
            customer_id,
            {"customer_id": customer_id, "plans": set(), "keys": [], "budgets": []},
        )

    for key in keys:
        if key["customer_id"]:
            found = entry(key["customer_id"])
            found["keys"].append(key["api_key_id"])
            if key["plan_id"]:
                found["plans"].add(key["plan_id"])
    for customer_id in usage:
        if customer_id:
            entry(customer_id)
    for status in statuses_in_force(session, now):
        scoped = status["scope"].get("customer_id")
        if scoped:
            entry(scoped)["budgets"].append(status)
    rows = [
        {**c, "plans": sorted(c["plans"]), "usage": usage.get(c["customer_id"])}
        for c in sorted(customers.values(), key=lambda c: c["customer_id"])
    ]
    return {"customers": rows}


def alerts_view(session: Session, items: Items, now: datetime) -> dict[str, Any]:
    """The alerts (newest first) with their webhook's delivery: state, attempts, the last
    answer or error."""
    del items, now
    return {"alerts": list(reversed(list_alerts(session, None, None)))}
