"""What each console page shows, built from the domain services in one read transaction.

Each ``*_view`` takes the session and the page's query string as (name, value) pairs (empty
form fields left out) and returns the template's context; bad parameters raise the services' own
``ValidationFailed`` (the page then shows its messages), an unknown call ``NotFound``. The
parameters are the API's (CONTRACT "Call log and usage queries", "Export"), checked by the same
parsers, so a console URL and an API URL with the same query mean the same thing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from billing.budgets.authorize import holds_in_flight
from billing.budgets.service import status_page
from billing.calllog import buckets
from billing.calllog.params import parse_zone
from billing.calllog.queries import STATUSES, list_calls, parse_calls_query
from billing.calllog.service import get_call
from billing.calllog.usage import TOTAL_FIELDS, parse_usage_query, usage_rows
from billing.calllog.views import call_json
from billing.console.chart import bar_chart, output_bar
from billing.console.words import anomaly_words, event_title
from billing.credits.rows import Owner
from billing.credits.service import balance, entries_json, list_customers
from billing.dimensions import TOKEN_FIELDS
from billing.drift.schemas import FIELDS as DRIFT_FIELDS
from billing.errors import FieldError, ValidationFailed
from billing.export.params import parse_params
from billing.export.service import period_label
from billing.plans.service import decode_id_cursor, encode_id_cursor
from billing.rollups.rows import BASES
from billing.timefmt import rfc3339

Items = Sequence[tuple[str, str]]

#: The periods a usage chart may be drawn by (``/v1/usage``'s ``group_by``).
CHART_PERIODS = ("day", "hour")
#: Zones offered in the usage form's list (any IANA zone may be typed).
ZONES: tuple[str, ...] = ("UTC", "America/New_York", "America/Los_Angeles", "Europe/London")
ZONES += ("Europe/Berlin", "Asia/Kolkata", "Asia/Tokyo", "Asia/Singapore", "Australia/Sydney")
#: The most periods a chart's time axis shows, empty ones included (a month by hour is 744).
MAX_AXIS = 1000
#: Fields of an event shown as its identity rather than its details.
_EVENT_IDENTITY = ("event_id", "request_id", "type", "occurred_at", "received_at")


def calls_view(session: Session, items: Items) -> dict[str, Any]:
    """The Calls page: one page of ``GET /v1/calls`` for the same query."""
    query = parse_calls_query(items)
    page = list_calls(session, query)
    return {"calls": [call_json(call) for call in page.calls], "next_cursor": page.next_cursor}


def call_view(session: Session, request_id: str) -> dict[str, Any]:
    """The Call page: ``GET /v1/calls/{request_id}``'s object with its output bar, timeline and
    anomalies in words."""
    call = get_call(session, request_id)
    events = call.pop("events")
    entries = call.pop("ledger_entries")
    first = _instant(events[0]["occurred_at"]) if events else None
    timeline = []
    for event in events:
        at = _instant(event["occurred_at"])
        offset = (at - first).total_seconds() if first is not None else 0.0
        timeline.append(
            {
                "title": event_title(str(event.get("type"))),
                "type": event.get("type"),
                "occurred_at": event["occurred_at"],
                "offset": f"+{offset:.3f} s",
                "details": [(k, v) for k, v in event.items() if k not in _EVENT_IDENTITY],
                "event_id": event.get("event_id"),
            }
        )
    return {
        "call": call,
        "bar": output_bar(call["output_tokens_delivered"], call["output_tokens_undelivered"]),
        "timeline": timeline,
        "entries": entries,
        "token_fields": TOKEN_FIELDS,
        "anomalies": [(code, anomaly_words(code)) for code in call["anomalies"]],
    }


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def usage_defaults(items: Items, now: datetime) -> list[tuple[str, str]]:
    """``items`` with the page's defaults filled in: the last 7 local days (today included) in
    the chosen zone, by day."""
    given = dict(items)
    filled = list(items)
    if "group_by" not in given:
        filled.append(("group_by", "day"))
    if "since" not in given or "until" not in given:
        try:
            zone = parse_zone(given.get("tz", "UTC"))
        except ValueError:
            zone = parse_zone("UTC")
        local = now.astimezone(zone)
        midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
        if "since" not in given:
            filled.append(("since", (midnight - timedelta(days=6)).isoformat()))
        if "until" not in given:
            filled.append(("until", (midnight + timedelta(days=1)).isoformat()))
    return filled


#: What the usage page may be grouped by (``/v1/usage``'s ``group_by``): a time axis, or one bar
#: per customer (``group_by=customer_id``: the same rows as the API's).
USAGE_GROUPS = (*CHART_PERIODS, "customer_id")
#: The figures of the usage table, in ``/v1/usage``'s row order: the totals, then the charge.
USAGE_FIELDS = (*TOTAL_FIELDS, "charge_usd")
#: How a null group value (a call without a customer) is shown on the chart's axis.
NO_VALUE = "(none)"


def usage_view(session: Session, items: Items) -> dict[str, Any]:
    """The Usage page: ``GET /v1/usage`` for the same query (grouped by ``hour`` or ``day``, or
    by ``customer_id``; for one key, customer or model when given), as two charts (cost and
    charge; input and output tokens) and the rows as a table (``USAGE_FIELDS``)."""
    query = parse_usage_query(items)
    if query.group_by not in [(name,) for name in USAGE_GROUPS]:
        raise ValidationFailed(
            [
                FieldError(
                    None,
                    "query.group_by",
                    "the console charts by day, by hour or by customer_id only",
                )
            ]
        )
    period = query.group_by[0]
    rows = [row.as_json() for row in usage_rows(session, query)]
    labels = [NO_VALUE if r[period] is None else str(r[period]) for r in rows]
    if period in CHART_PERIODS:
        axis = _axis(period, query.since, query.until, query.tz, labels)
        short: Callable[[str], str] = _short_hour if period == "hour" else _short_day
    else:
        axis, short = labels, str

    def by_period(field: str) -> dict[str, Any]:
        return {label: row[field] for label, row in zip(labels, rows, strict=True)}

    money = bar_chart(
        "Cost and charge (USD)",
        axis,
        [("cost_usd", by_period("cost_usd")), ("charge_usd", by_period("charge_usd"))],
        short,
    )
    tokens = bar_chart(
        "Tokens",
        axis,
        [
            ("input_tokens", by_period("input_tokens")),
            ("output_tokens_billed", by_period("output_tokens_billed")),
        ],
        short,
    )
    return {
        "period": period,
        "rows": rows,
        "fields": USAGE_FIELDS,
        "charts": [money, tokens],
    }


def _axis(
    period: str, since: datetime, until: datetime, zone: ZoneInfo, shown: list[str]
) -> list[str]:
    """The chart's time axis: every local hour or day of ``[since, until)`` (empty ones too, so
    that gaps show), or only the ``shown`` periods when there would be more than
    ``MAX_AXIS`` of them."""
    length = timedelta(hours=1) if period == "hour" else timedelta(days=1)
    if (until - since) / length > MAX_AXIS:
        return shown
    starts = buckets.period_starts(period, since, until, zone)
    return [buckets.label(period, at, zone) for at in starts]


def _short_hour(label: str) -> str:
    """``2026-10-15T05:00:00+05:30`` → ``10-15 05:00`` (the table keeps the full label)."""
    return label[5:16].replace("T", " ")


def _short_day(label: str) -> str:
    """``2026-10-15`` → ``10-15``."""
    return label[5:]


def exports_view(items: Items, now: datetime, close_lag_s: float) -> dict[str, Any]:
    """The Exports page: the download links for the period (checked as the exports check it) and
    whether the period is closed or still provisional."""
    given = dict(items)
    since, until = given.get("since"), given.get("until")
    params = parse_params("usage", since, until, given.get("group_by"), given.get("tz"), items)
    return {
        "usage_query": {k: given.get(k) for k in ("since", "until", "group_by", "tz")},
        "calls_query": {"since": rfc3339(params.since), "until": rfc3339(params.until)},
        "period": period_label(params, now, close_lag_s),
    }


def period_defaults(items: Items, now: datetime, days: int) -> list[tuple[str, str]]:
    """``items`` with the last ``days`` whole UTC days (today excluded) as the default period."""
    given = dict(items)
    filled = list(items)
    today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if "since" not in given:
        filled.append(("since", rfc3339(today - timedelta(days=days)) or ""))
    if "until" not in given:
        filled.append(("until", rfc3339(today) or ""))
    return filled


#: The keys of a drift row that are not group keys (CONTRACT "Provider reports and drift").
DRIFT_FIGURES = ("ours", "theirs", "delta", "delta_pct", "status")


def drift_view(rows: list[dict[str, Any]], calls: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Drift page for ``GET /v1/drift``'s rows (``billing.drift.service.drift_rows``),
    mismatches first (any status but ``match``), then in the service's order; ``calls``: a
    page of ``GET /v1/drift/calls`` (``billing.drift.service.call_drift``), shown below, with
    whether more follow."""
    keys = [k for k in (rows[0] if rows else {}) if k not in DRIFT_FIGURES]
    ordered = sorted(rows, key=lambda row: row.get("status") == "match")
    page = calls or {"data": [], "next_cursor": None}
    return {
        "rows": ordered,
        "keys": keys,
        "fields": DRIFT_FIELDS,
        "calls": page["data"],
        "more_calls": page["next_cursor"] is not None,
    }


#: Budgets the Budgets page shows (the next after a cursor).
BUDGETS_PER_PAGE = 100


def budgets_view(session: Session, items: Items, now: datetime) -> dict[str, Any]:
    """The Budgets page: a page of the budgets in force (by ``budget_id``, ``BUDGETS_PER_PAGE``
    after the ``cursor``) with their current period's status
    (``billing.budgets.service.status_page``: only the page's are computed; the shape of
    ``GET /v1/budgets/{id}``) and progress (``fraction_used``, at most 1 for the bar); the holds
    of authorizations counted now, with their age (``billing.budgets.authorize.holds_in_flight``).
    """
    text = dict(items).get("cursor")
    try:
        after = None if text is None else decode_id_cursor("b", text)
    except ValueError as bad:
        raise ValidationFailed([FieldError(None, "query.cursor", str(bad))]) from None
    rows, last = status_page(session, after, BUDGETS_PER_PAGE, now)
    for row in rows:
        row["progress"] = f"{min(Decimal(row['fraction_used']), Decimal(1)):f}"
    return {
        "budgets": rows,
        "next_cursor": None if last is None else encode_id_cursor("b", last),
        "holds": holds_in_flight(session, now),
    }


#: The latest credit entries the Credits page shows of an owner.
CREDIT_ENTRIES = 50


def credits_view(session: Session, owner: Owner | None, now: datetime) -> dict[str, Any]:
    """The Credits page: the customers (``GET /v1/customers``' first page) with their balance,
    or one owner's balance (``GET /v1/credits/balance``), grants and latest entries."""
    if owner is None:
        customers, _ = list_customers(session, None, 100, now)
        return {"customers": customers, "owner": None}
    return {
        "owner": balance(session, owner, now),
        "entries": entries_json(session, owner, CREDIT_ENTRIES, now),
    }


STATUS_CHOICES = STATUSES
BASIS_CHOICES = BASES
