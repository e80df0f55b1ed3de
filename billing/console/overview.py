"""The console's landing page, **Overview** (CONTRACT "Observability and standard exports
(v3)"): a period's cost and charge against the period before, spend per day by model (drawn by
the vendored uPlot, ``static/overview.js``), the top keys, customers and models, the share of
paid output no client received, the disconnect and error rates, unpriced calls, budgets near or
over their limit and the alert webhooks failing (latest attempt failed).

The figures are ``GET /v1/usage``'s (``billing.calllog.usage.usage_rows``: the rollups) for the
same ``since`` / ``until``, written for people (``billing.console.people``) with the exact value
beside each; the settled calls by status from their rollup (``call_status_rollups``), the open
ones and the webhooks from the observability room.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy.orm import Session

from billing.budgets.service import fullest_statuses
from billing.calllog import buckets
from billing.calllog.params import parse_zone, query_problems
from billing.calllog.queries import STATUSES
from billing.calllog.usage import (
    MAX_PERIODS,
    UsageQuery,
    parse_usage_query,
    settled_statuses,
    units_of,
    usage_rows,
    usage_top,
)
from billing.console.people import change, share
from billing.errors import FieldError, ValidationFailed
from billing.fields import EARLIEST
from billing.money import format_usd, pusd_to_str
from billing.observe.repository import repository as observe
from billing.storage.db import read_beside

Items = Sequence[tuple[str, str]]
#: Rows in each "top" table, and models drawn in the chart (the rest summed as "other").
TOP = 5
#: Keys and customers ranked by the rollups to show the ``TOP`` of (their exact figures are
#: sorted again: the ranking is in floating point, and leaves out the minutes of a period off
#: the 15-minute grid).
RANKED = 3 * TOP
#: Budgets near or over their limit listed, of the fullest ``BUDGETS_READ`` (their counters'
#: ranking is in floating point and leaves out holds: more are read than shown).
BUDGETS_SHOWN = 10
BUDGETS_READ = 40


#: The Overview's query parameters (``/v1/usage``'s names): any other is refused (422), as the
#: Usage page refuses a parameter it does not know.
PARAMETERS = ("since", "until", "tz")
#: Whole days of the default period, today included.
DEFAULT_DAYS = 30


def overview_defaults(items: Items, now: datetime) -> list[tuple[str, str]]:
    """``items`` with the missing ``since`` / ``until`` filled in: the last ``DEFAULT_DAYS``
    whole days of the zone ``tz`` (UTC when absent; when unknown, UTC too, and the page then
    names ``tz``), today included, written with the zone's offset. Every given pair is kept, so
    that a bad or unknown one is refused by ``parse_overview_query``, never replaced."""
    given = dict(items)
    filled = list(items)
    if "since" not in given or "until" not in given:
        try:
            zone = parse_zone(given.get("tz", "UTC"))
        except ValueError:
            zone = parse_zone("UTC")
        today = now.astimezone(zone).date()

        def midnight(days: int) -> str:
            start = datetime.combine(today + timedelta(days=days), time(0), tzinfo=zone)
            return start.astimezone(UTC).astimezone(zone).isoformat()

        if "since" not in given:
            filled.append(("since", midnight(1 - DEFAULT_DAYS)))
        if "until" not in given:
            filled.append(("until", midnight(1)))
    return filled


def parse_overview_query(items: Items) -> UsageQuery:
    """``since``, ``until`` and ``tz`` read as ``GET /v1/usage`` reads them
    (``parse_usage_query``: the same messages); ``ValidationFailed`` (422) lists every problem,
    a parameter the Overview does not take included."""
    unknown = query_problems([(k, v) for k, v in items if k not in PARAMETERS], PARAMETERS)
    try:
        query = parse_usage_query([(k, v) for k, v in items if k in PARAMETERS])
    except ValidationFailed as failed:
        raise ValidationFailed([*failed.errors, *unknown]) from None
    if unknown:
        raise ValidationFailed(unknown)
    if query.until - query.since > timedelta(days=MAX_PERIODS):
        # Its chart is by day: named here on the form's own field, not as /v1/usage's
        # ``group_by``, which the Overview has none of.
        message = f"the Overview charts the period by day: at most {MAX_PERIODS} days after since"
        raise ValidationFailed([FieldError(None, "query.until", message)])
    return query


def _rows(
    session: Session, query: UsageQuery, *group_by: str, units: Sequence[Any] | None = None
) -> list[dict[str, Any]]:
    grouped = UsageQuery(query.since, query.until, group_by=tuple(group_by), tz=query.tz)
    return [row.as_json() for row in usage_rows(session, grouped, units)]


def _cost(row: dict[str, Any]) -> Decimal:
    return Decimal(row["cost_usd"] or 0)


def _top(
    session: Session, query: UsageQuery, key: str, units: Sequence[Any]
) -> list[dict[str, Any]]:
    """The ``TOP`` keys or customers (``key``) of the highest cost: the exact ``/v1/usage``
    rows of the ``RANKED`` the rollups rank first (``usage_top``), sorted by cost (an unknown
    cost as 0), then name."""
    rows = usage_top(session, query, key, RANKED, units)
    return _top_of([row.as_json() for row in rows], key)


def _top_of(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    ranked = sorted(rows, key=lambda r: (-_cost(r), str(r[key])))[:TOP]
    return [
        {
            "name": r[key] if r[key] is not None else "(none)",
            "calls": r["calls"],
            "cost": r["cost_usd"],
            "charge": r["charge_usd"],
        }
        for r in ranked
    ]


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The period's one row of ``/v1/usage`` (no group): a cost or charge is None (unknown) when
    a call of the period has none, as the API answers; a period without calls costs 0."""
    row = rows[0] if rows and rows[0]["calls"] else {"cost_usd": "0", "charge_usd": "0"}
    return {
        "calls": row.get("calls", 0),
        "cost": row["cost_usd"],
        "charge": row["charge_usd"],
        "billed": row.get("output_tokens_billed", 0),
        "undelivered": row.get("output_tokens_undelivered", 0),
    }


def _spend(rows: list[dict[str, Any]], query: UsageQuery) -> dict[str, Any]:
    """uPlot's data: the zone's days of the period (``x``: their starts in Unix seconds;
    ``days``: their ``/v1/usage`` labels, ``YYYY-MM-DD``), the zone (``tz``) and the period's
    end (``until``, Unix seconds), and one cost series per model (the ``TOP`` of the highest
    cost, then ``other``), null where a model had no cost that day."""
    starts = buckets.period_starts("day", query.since, query.until, query.tz)
    labels = [buckets.label("day", at, query.tz) for at in starts]
    by_model: dict[str, dict[str, Decimal]] = {}
    for r in rows:
        if r["cost_usd"] is not None:  # an unpriced model's day has no point (cost unknown)
            by_model.setdefault(r["model"] or "(none)", {})[r["day"]] = _cost(r)
    ranked = sorted(by_model, key=lambda m: (-sum(by_model[m].values()), m))
    shown = ranked[:TOP]
    series = {m: by_model[m] for m in shown}
    if len(ranked) > TOP:
        other: dict[str, Decimal] = {}
        for m in ranked[TOP:]:
            for label, cost in by_model[m].items():
                other[label] = other.get(label, Decimal(0)) + cost
        series["other"] = other
    return {
        "x": [int(at.timestamp()) for at in starts],
        "days": labels,
        "tz": query.tz.key,
        "until": int(query.until.timestamp()),
        "series": [
            # Exact decimal text; the chart's script makes its points of them in the browser.
            {"name": name, "values": [_exact(costs.get(label)) for label in labels]}
            for name, costs in series.items()
        ],
    }


def _days(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``/v1/usage?group_by=day`` (the same ``tz``) from those by day and model:
    each day's calls, cost and charge summed, a cost or charge unknown (None) when a model's
    is that day, as the API's row of the day is (its calls are the models' calls)."""
    days: dict[str, dict[str, Any]] = {}
    for r in rows:
        day = days.setdefault(r["day"], {"day": r["day"], "calls": 0, "cost": 0, "charge": 0})
        day["calls"] += r["calls"]
        for name, field in (("cost", "cost_usd"), ("charge", "charge_usd")):
            value = r[field]
            day[name] = None if value is None or day[name] is None else day[name] + _pusd(value)
    return [
        {**d, "cost": pusd_to_str(d["cost"]), "charge": pusd_to_str(d["charge"])}
        for d in days.values()
    ]


def _pusd(text: str) -> int:
    """A ``/v1/usage`` amount (exact decimal text, at most 12 places) in picodollars."""
    return int(Decimal(text).scaleb(12))


def _exact(value: Decimal | None) -> str | None:
    return None if value is None else format_usd(value)


def overview_view(
    session: Session,
    items: Items,
    now: datetime,
    *,
    budgets_shown: bool = True,
    alerts_shown: bool = True,
) -> dict[str, Any]:
    """The Overview page's context for ``items`` (``since``, ``until``, ``tz``: the zone of the
    chart's days); ``ValidationFailed`` for a bad, missing or unknown parameter. The budgets
    near their limit and the alert deliveries are read only when the viewer may see them
    (``budgets_shown``, ``alerts_shown``: the cards follow the role)."""
    query = parse_overview_query(items)
    # The period's calls with units, read once for its five groupings (one statement each).
    units = units_of(session, UsageQuery(query.since, query.until))

    def beside(reader: Session) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        keys = _top(reader, query, "api_key_id", units)
        return keys, fullest_statuses(reader, now, BUDGETS_READ) if budgets_shown else []

    # The top keys (their month bounds) and the budgets' latest counters, half of the page's
    # database time at 10,000 keys and budgets, are read on a second connection of the same
    # snapshot while the rest is read here (PostgreSQL; else one after the other:
    # ``read_beside``).
    with read_beside(session, beside) as beside_read:
        return _overview(session, query, units, beside_read, alerts_shown)


def _overview(
    session: Session,
    query: UsageQuery,
    units: Sequence[Any],
    beside: Callable[[], tuple[list[dict[str, Any]], list[dict[str, Any]]]],
    alerts_shown: bool,
) -> dict[str, Any]:
    """``overview_view``'s context; ``beside`` gives the top keys and the budgets' statuses
    (asked after the page's other reads: ``read_beside``'s answer)."""
    length = query.until - query.since
    # The period of the same length before, cut at the earliest instant the service holds (a
    # long period's would start before year 1: an OverflowError, the page a 500).
    start = query.since - length if query.since - EARLIEST >= length else EARLIEST
    before = UsageQuery(start, query.since) if start < query.since else None
    period = UsageQuery(query.since, query.until)
    current = usage_rows(session, period, units)
    totals = _totals([row.as_json() for row in current])
    previous = _totals(_rows(session, before) if before is not None else [])
    repo = observe(session)
    # Settled calls from the rollups; the open ones (in flight: few) from ``calls``.
    settled = settled_statuses(session, query.since, query.until)
    opened = repo.calls_by_status(session, ("open",), query.since, query.until)
    statuses = {status: settled.get(status, 0) + opened.get(status, 0) for status in STATUSES}
    started = sum(statuses.values())
    deliveries = repo.deliveries_by_state(session) if alerts_shown else {}
    per_model = _rows(session, query, "model", units=units)
    by_day = _rows(session, query, "day", "model", units=units)
    spend = _spend(by_day, query)
    top_customers = _top(session, query, "customer_id", units)
    failed = repo.failing_deliveries(session) if alerts_shown else 0
    top_keys, fullest = beside()
    budgets = [b for b in fullest if b["state"] in ("warning", "exceeded")][:BUDGETS_SHOWN]
    return {
        "since": query.since.isoformat(),
        "until": query.until.isoformat(),
        "previous": {"since": start.isoformat(), "until": query.since.isoformat()},
        "totals": totals,
        "before": previous,
        "cost_change": change(totals["cost"], previous["cost"]),
        "charge_change": change(totals["charge"], previous["charge"]),
        "undelivered_share": share(totals["undelivered"], totals["billed"]),
        "statuses": statuses,
        "started": started,
        "disconnect_rate": share(statuses.get("client_disconnected", 0), started),
        "error_rate": share(statuses.get("failed", 0), started),
        "unpriced": sum(row.unpriced for row in current),
        "top_keys": top_keys,
        "top_customers": top_customers,
        "top_models": _top_of(per_model, "model"),
        "priced_cost": sum((_cost(r) for r in per_model), Decimal(0)),
        "priced_charge": sum((Decimal(r["charge_usd"] or 0) for r in per_model), Decimal(0)),
        "budgets": budgets,
        "failed": failed,
        "delivered": deliveries.get("delivered", 0),
        "tz": query.tz.key,
        "days": _days(by_day),
        "spend_json": json.dumps(spend, separators=(",", ":")),
        "spend_models": [s["name"] for s in spend["series"]],
    }
