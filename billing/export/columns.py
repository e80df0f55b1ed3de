"""The CSV columns of the finance exports, in their fixed order (CONTRACT "Export").

``usage.csv`` — one row per group of ledger entries booked in ``[since, until)``:

1. the group columns, in the order given by ``group_by`` (default ``day,api_key_id,model``):
   ``api_key_id``, ``model`` (text), ``hour`` (RFC 3339 with the zone's offset,
   ``2026-10-15T08:00:00+02:00``), ``day`` (``YYYY-MM-DD``), ``month`` (``YYYY-MM``), the buckets
   starting where the ``tz`` zone's hours, days and months start;
2. ``calls`` (the number of ``settlement`` entries in the group), then the token totals
   ``input_tokens``, ``cache_read_input_tokens``, ``cache_creation_input_tokens``,
   ``output_tokens_billed``, ``output_tokens_delivered``, ``output_tokens_undelivered``,
   ``reasoning_tokens`` (sums of the entries' signed deltas), then ``cost_usd``.

``calls.csv`` — one row per ledger entry booked in ``[since, until)``:

``entry_id``, ``kind`` (``settlement`` | ``adjustment``), ``reason``, ``booked_at`` (RFC 3339,
UTC), ``request_id``, ``api_key_id``, ``model``, ``protocol``, ``status``, the seven token
columns above (signed deltas: an adjustment can be negative), the prices used
``input_usd_per_mtok``, ``output_usd_per_mtok``, ``cache_read_usd_per_mtok``,
``cache_creation_usd_per_mtok`` (USD per million tokens; empty when the entry is unpriced), and
``cost_usd``. Each row's cost recomputes from its own columns::

    cost_usd = (input_tokens × input_usd_per_mtok
                + cache_read_input_tokens × cache_read_usd_per_mtok
                + cache_creation_input_tokens × cache_creation_usd_per_mtok
                + output_tokens_billed × output_usd_per_mtok) / 1,000,000
"""

from __future__ import annotations

from typing import Final

from billing.calllog.buckets import TIME_DIMS
from billing.dimensions import TOKEN_FIELDS
from billing.pricing.rates import RATE_FIELDS

#: The token buckets, in the contract's usage-totals order.
TOKEN_COLUMNS: Final[tuple[str, ...]] = tuple(TOKEN_FIELDS)

#: The names ``group_by`` accepts; time buckets (as ``GET /v1/usage``) and text keys.
TIME_KEYS: Final[tuple[str, ...]] = TIME_DIMS
TEXT_KEYS: Final[tuple[str, ...]] = ("api_key_id", "model")
GROUP_KEYS: Final[tuple[str, ...]] = (*TEXT_KEYS, *TIME_KEYS)
DEFAULT_GROUP_BY: Final[tuple[str, ...]] = ("day", "api_key_id", "model")

#: The columns after the group columns in ``usage.csv``.
USAGE_TOTAL_COLUMNS: Final[tuple[str, ...]] = ("calls", *TOKEN_COLUMNS, "cost_usd")

#: The prices used, per entry, as in ``GET /v1/calls/{request_id}`` ``ledger_entries``.
PRICE_COLUMNS: Final[tuple[str, ...]] = RATE_FIELDS

#: Every column of ``calls.csv``, in order.
CALLS_COLUMNS: Final[tuple[str, ...]] = (
    "entry_id",
    "kind",
    "reason",
    "booked_at",
    "request_id",
    "api_key_id",
    "model",
    "protocol",
    "status",
    *TOKEN_COLUMNS,
    *PRICE_COLUMNS,
    "cost_usd",
)


def usage_columns(group_by: tuple[str, ...]) -> tuple[str, ...]:
    """The header of ``usage.csv`` for ``group_by``: group columns, then the totals."""
    return (*group_by, *USAGE_TOTAL_COLUMNS)
