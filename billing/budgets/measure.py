"""Which ledger amount a budget's ``measure`` reads: the one place that says so.

CONTRACT "Budgets and alerts (v2)": ``cost`` is what the provider bills us (``cost_pusd``),
``charge`` what we bill the customer (``charge_pusd``, from the key's plan: CONTRACT "Keys,
customers and plans (v2)"; without a plan it equals the cost).
"""

from __future__ import annotations

MEASURES = ("charge", "cost")
DEFAULT_MEASURE = "charge"

#: The column of ``ledger_entries`` and of ``calls`` (the same name in both) each measure sums,
#: in picodollars. A null amount (an unpriced line) adds 0.
AMOUNT_COLUMNS: dict[str, str] = {
    "cost": "cost_pusd",
    "charge": "charge_pusd",
}
