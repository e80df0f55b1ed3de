"""The rows that cross the rollups' repository (``billing.rollups.repository``): the bases and
the summed columns of the usage rollups, and the key and sums of the drift's rollup."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from billing.dimensions import TOKEN_FIELDS

#: The bases of the rollups (CONTRACT "Call log and usage queries"): settled calls in the bucket
#: of their start, and ledger entries in the bucket of their booking.
CALL_START = "call_start"
BOOKED = "booked"
BASES = (CALL_START, BOOKED)

#: Picodollars per US dollar.
PICO = 10**12
#: The summed integer columns of a rollup row, in the order of ``Totals.values``.
COUNT_FIELDS = ("members", "calls", *TOKEN_FIELDS, "unpriced", "uncharged")

#: Rollup rows to add (see ``RollupsRepository``).
Rows = Sequence[tuple[Any, ...]]
#: The summed columns of a usage rollup row.
ROLLUP_SUMMED = (
    *COUNT_FIELDS,
    "cost_whole_usd",
    "cost_frac_pusd",
    "charge_whole_usd",
    "charge_frac_pusd",
    "leakage_whole_usd",
    "leakage_frac_pusd",
)

#: (0021) The statuses of a settled call, which ``call_status_rollups`` counts (an open call is
#: never rolled up).
SETTLED_STATUSES = ("completed", "client_disconnected", "failed")
#: A contribution's calls by status: ``(status, count)`` pairs.
Statuses = tuple[tuple[str, int], ...]

#: ``drift_rollups.level``: UTC hours, UTC days.
HOUR, DAY = 0, 1
#: A ``drift_rollups`` row's key, as the database returns it: the hour (the driver's value),
#: provider, model, upstream account, served tier (``''`` for none).
RollupKey = tuple[Any, str, str, str, str]
#: Its summed columns (``billing.storage.models.DriftRollup``): calls, requests, input, cache
#: read, cache creation and output tokens, cost whole dollars, cost picodollars, unpriced calls.
RollupSums = list[int]
#: Contributions to ``drift_rollups``, summed per row key.
Contributions = dict[RollupKey, RollupSums]
