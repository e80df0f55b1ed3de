"""Which ledger amount a budget's ``measure`` reads: the one place that says so.

CONTRACT "Budgets and alerts (v2)": ``cost`` is what the provider bills us (``cost_pusd``),
``charge`` what we bill the customer. Without a plan, ``charge_usd`` = ``cost_usd``
(CONTRACT "Keys and plans"), and this branch has no plans yet: ``charge`` reads ``cost_pusd``.
TODO(#24, at merge): point ``charge`` at ``ledger_entries.charge_pusd`` / ``calls.charge_pusd``
(``AMOUNT_COLUMNS["charge"] = "charge_pusd"``); nothing else changes.
"""

from __future__ import annotations

MEASURES = ("charge", "cost")
DEFAULT_MEASURE = "charge"

#: The column of ``ledger_entries`` and of ``calls`` (the same name in both) each measure sums,
#: in picodollars. A null amount (an unpriced line) adds 0.
AMOUNT_COLUMNS: dict[str, str] = {
    "cost": "cost_pusd",
    # #24 makes this "charge_pusd".
    "charge": "cost_pusd",
}
