"""``GET /v1/exports/drift.csv`` and ``billing drift``: the drift rows as CSV (stdlib ``csv``,
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
