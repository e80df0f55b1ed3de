"""``GET /v1/exports/drift.csv`` and ``billing drift``: the drift rows (and, ``billing drift
--calls``, the per-call rows of ``GET /v1/drift/calls``) as CSV (stdlib ``csv``,
the exports' conventions: ``\\r\\n`` rows, minimal quoting, formula-like text cells made inert,
an empty cell for null)."""

from __future__ import annotations

import csv
import io
from typing import Any

from billing.drift.schemas import FIELDS, DriftQuery
from billing.export.csvwriter import neutralise

_SIDES = ("ours", "theirs", "delta", "delta_pct")


def columns(query: DriftQuery) -> list[str]:
    """The header: the group keys, ``status``, then per figure ours, theirs, delta and
    delta_pct (``ours_requests``, ``theirs_requests``, ``delta_requests``, …)."""
    return [*query.keys, "status", *(f"{side}_{name}" for name in FIELDS for side in _SIDES)]


def drift_csv(query: DriftQuery, rows: list[dict[str, Any]]) -> bytes:
    """``rows`` (``billing.drift.service.drift_rows``) as UTF-8 CSV bytes."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns(query))
    for row in rows:
        writer.writerow(
            [
                *(neutralise(row[key]) for key in query.keys),
                row["status"],
                *(row[side][name] for name in FIELDS for side in _SIDES),
            ]
        )
    return out.getvalue().encode()


#: The per-call CSV's header (``billing drift --calls``): the keys of a ``CallDriftRow``, its
#: figures named as the grouped CSV names the cost's (``ours_cost_usd``, …).
CALL_COLUMNS = (
    "request_id",
    "started_at",
    "provider",
    "model",
    "api_key_id",
    "upstream_account",
    "settled",
    "status",
    *(f"{side}_cost_usd" for side in _SIDES),
)
_CALL_KEYS = CALL_COLUMNS[:6]


def calls_csv(rows: list[dict[str, Any]]) -> bytes:
    """``rows`` (``billing.drift.service.call_drift``'s, every page) as UTF-8 CSV bytes."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CALL_COLUMNS)
    for row in rows:
        writer.writerow(
            [
                *(neutralise(row[key]) for key in _CALL_KEYS),
                "true" if row["settled"] else "false",
                row["status"],
                *(row[side] for side in _SIDES),
            ]
        )
    return out.getvalue().encode()
