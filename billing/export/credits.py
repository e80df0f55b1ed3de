"""``credits.csv``: the credit entries (grants, draws, reversals, expiries, voids, overdrafts)
booked in a period, and its manifest (CONTRACT "Prepaid credits (v3)", "Export").

A period is a UTC month (``period=2026-03``: ``[2026-03-01, 2026-04-01)``), by booking time
like the ledger's exports: entries are only ever added, at their booking time, so a closed
period's bytes never change (a re-rating after the month closed reverses and redraws in the
month it is booked in). Expiries due by now are booked first (``book_expiries``, at their
``expires_at``), so the first export of a closed month already holds every expiry in it.

The manifest states the identity: Σ grants − Σ draws − Σ expiries − Σ voids = Σ balances
(every grant's remainder) at the period's end, draws net of their reversals; and the same over
the period's own entries from the opening to the closing balance. Overdrafts are beside it:
they draw no grant.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from billing.credits.draws import book_expiries
from billing.credits.repository import repository
from billing.credits.rows import DRAW, EXPIRY, GRANT, OVERDRAFT, REVERSAL, VOID
from billing.errors import FieldError, ValidationFailed
from billing.export.csvwriter import csv_cell, pusd_cell
from billing.export.service import is_closed
from billing.storage.db import read_transaction, write_transaction
from billing.timefmt import month_bounds, rfc3339

#: The columns of ``credits.csv``.
CREDITS_COLUMNS = (
    "entry_id",
    "kind",
    "booked_at",
    "customer_id",
    "api_key_id",
    "grant_id",
    "amount_usd",
    "request_id",
    "ledger_seq",
)


def parse_period(text: str | None) -> tuple[datetime, datetime]:
    """``YYYY-MM`` → the UTC month ``[since, until)`` (``billing.timefmt.month_bounds``);
    ``ValidationFailed`` (422) naming ``query.period`` otherwise."""
    try:
        if text is None:
            raise ValueError("is required: a UTC month such as 2026-03")
        return month_bounds(text)
    except ValueError as error:
        raise ValidationFailed([FieldError(None, "query.period", str(error))]) from None


def credits_csv(session: Session, since: datetime, until: datetime) -> bytes:
    """The CSV of the entries booked in ``[since, until)``, by booking time then id."""
    lines = [",".join(CREDITS_COLUMNS)]
    for row in repository(session).entries_between(session, since, until):
        cells = (
            str(row.entry_id),
            csv_cell(row.kind),
            str(rfc3339(row.booked_at)),
            csv_cell(row.customer_id),
            csv_cell(row.api_key_id),
            csv_cell(row.grant_id),
            pusd_cell(row.amount_pusd) or "0",
            csv_cell(row.request_id),
            "" if row.ledger_seq is None else str(row.ledger_seq),
        )
        lines.append(",".join(cells))
    return ("\r\n".join(lines) + "\r\n").encode()


def _sums(totals: dict[tuple[str, bool], int]) -> dict[str, int]:
    return {
        "grants": totals.get((GRANT, True), 0),
        # Net of the reversals that gave amounts back to grants.
        "draws": totals.get((DRAW, True), 0) + totals.get((REVERSAL, True), 0),
        "expiries": totals.get((EXPIRY, True), 0),
        "voids": totals.get((VOID, True), 0),
        "overdrafts": totals.get((OVERDRAFT, False), 0) + totals.get((REVERSAL, False), 0),
    }


def _usd(sums: dict[str, int]) -> dict[str, str]:
    return {f"{name}_usd": pusd_cell(value) or "0" for name, value in sums.items()}


def credits_manifest(
    session: Session, period: str, since: datetime, until: datetime, body: bytes, closed: bool
) -> dict[str, Any]:
    """The manifest of ``body`` (the period's CSV, read in the same transaction)."""
    repo = repository(session)
    to_date = _sums(repo.kind_totals(session, None, until))
    in_period = _sums(repo.kind_totals(session, since, until))
    opening = sum(repo.balances_before(session, since).values())
    closing = sum(repo.balances_before(session, until).values())
    drawn = to_date["grants"] - to_date["draws"] - to_date["expiries"] - to_date["voids"]
    moved = in_period["grants"] - in_period["draws"] - in_period["expiries"] - in_period["voids"]
    return {
        "export": "credits",
        "period": period,
        "since": rfc3339(since),
        "until": rfc3339(until),
        "status": "closed" if closed else "provisional",
        "rows": body.count(b"\r\n") - 1,
        "sha256": hashlib.sha256(body).hexdigest(),
        "to_date": {**_usd(to_date), "balances_usd": pusd_cell(closing) or "0"},
        "in_period": _usd(in_period),
        "opening_balance_usd": pusd_cell(opening) or "0",
        "closing_balance_usd": pusd_cell(closing) or "0",
        "identity": "grants - draws - expiries - voids = balances at the period's end",
        "identity_holds": drawn == closing and opening + moved == closing,
    }


def export_credits(
    sessions: sessionmaker[Session], period: str | None, now: datetime, close_lag_s: float
) -> tuple[bytes, dict[str, Any]]:
    """``GET /v1/exports/credits.csv`` and its manifest: the expiries due by ``now`` booked
    (one write transaction), then the period's CSV and manifest read in one snapshot."""
    since, until = parse_period(period)
    with write_transaction(sessions) as session:
        book_expiries(session, now)
    with read_transaction(sessions) as session:
        body = credits_csv(session, since, until)
        closed = is_closed(until, now, close_lag_s)
        # The month as YYYY-MM, whatever spaces the query had around it.
        month = f"{since:%Y-%m}"
        return body, credits_manifest(session, month, since, until, body, closed)
