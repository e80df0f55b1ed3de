"""The rows that cross the observability room's repository (``billing.observe.repository``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from billing.dimensions import TOKEN_FIELDS


@dataclass
class ModelTotals:
    """One model's totals over every rollup month: the token buckets (``TOKEN_FIELDS``), the
    exact cost, charge and leakage (cost the failure policy left uncharged) in picodollars, and
    the settled calls without a price."""

    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_FIELDS, 0))
    cost_pusd: int = 0
    charge_pusd: int = 0
    leakage_pusd: int = 0
    unpriced_calls: int = 0

    def add(self, other: ModelTotals) -> None:
        for name, value in other.tokens.items():
            self.tokens[name] += value
        self.cost_pusd += other.cost_pusd
        self.charge_pusd += other.charge_pusd
        self.leakage_pusd += other.leakage_pusd
        self.unpriced_calls += other.unpriced_calls
