"""The ledger's Prometheus families (CONTRACT "Observability and standard exports (v3)"), a
``prometheus_client`` ``Collector`` that reads a ``Snapshot`` (``billing.observe.service``) at
each scrape. Money is exact until here; a sample is a float by nature, converted at this edge.

The ``*_total`` families are gauges, not counters: a negative adjustment lowers the ledger's
sums (a counter must never go down, or ``rate()`` reads it as a restart).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import cast

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from billing.money import PICO
from billing.observe.service import Snapshot, snapshot
from billing.settings import Settings
from billing.storage.db import read_transaction

log = logging.getLogger("billing")

#: ``billing_tokens_total``'s ``type`` label → the token bucket it sums. ``cache_creation_1h``
#: is a part of ``cache_creation`` and ``reasoning`` of ``output`` (do not add them up).
TOKEN_TYPES = {
    "input": "input_tokens",
    "cache_read": "cache_read_input_tokens",
    "cache_creation": "cache_creation_input_tokens",
    "cache_creation_1h": "cache_creation_1h_input_tokens",
    "output": "output_tokens_billed",
    "reasoning": "reasoning_tokens",
}
_LABELS = ["model", "provider"]


def _sample(amount: Decimal) -> float:
    """An exact amount as a sample's value: prometheus-client writes every sample with
    ``float()`` in its exposition, so the exact ``Decimal`` goes in and the library's edge
    converts it (annotated as the float its signature names)."""
    return cast(float, amount)


def _usd(pusd: int) -> float:
    return _sample(Decimal(pusd) / PICO)


def families(snap: Snapshot) -> Iterator[GaugeMetricFamily]:
    """The families of one snapshot."""
    cost = GaugeMetricFamily(
        "billing_cost_usd_total", "What providers bill, in USD (the ledger).", labels=_LABELS
    )
    charge = GaugeMetricFamily(
        "billing_charge_usd_total", "What customers are charged, in USD.", labels=_LABELS
    )
    # The cost that a plan's charge policy for failed calls left uncharged (CONTRACT "Charge
    # policy for failed calls (v3)"), from the rollups' leakage columns.
    leakage = GaugeMetricFamily(
        "billing_leakage_usd_total", "Cost left uncharged by the failure policy.", labels=_LABELS
    )
    tokens = GaugeMetricFamily(
        "billing_tokens_total", "Tokens billed, by type.", labels=[*_LABELS, "type"]
    )
    undelivered = GaugeMetricFamily(
        "billing_undelivered_output_tokens_total",
        "Billed output tokens no client received.",
        labels=_LABELS,
    )
    unpriced = GaugeMetricFamily(
        "billing_unpriced_calls_total", "Settled calls without a price.", labels=_LABELS
    )
    for (model, provider), t in sorted(snap.by_model.items()):
        labels = [model, provider]
        cost.add_metric(labels, _usd(t.cost_pusd))
        charge.add_metric(labels, _usd(t.charge_pusd))
        leakage.add_metric(labels, _usd(t.leakage_pusd))
        for kind, field in TOKEN_TYPES.items():
            tokens.add_metric([*labels, kind], t.tokens[field])
        undelivered.add_metric(labels, t.tokens["output_tokens_undelivered"])
        unpriced.add_metric(labels, t.unpriced_calls)
    yield from (cost, charge, leakage, tokens, undelivered, unpriced)
    yield GaugeMetricFamily(
        "billing_reconcile_lag_seconds",
        "How long the oldest call due to the reconciler has waited.",
        value=snap.lag.total_seconds(),
    )
    deliveries = GaugeMetricFamily(
        "billing_webhook_deliveries_total",
        "Budget alert webhooks by outcome (pending, delivered, failed).",
        labels=["outcome"],
    )
    for outcome in sorted({"pending", "delivered", "failed", *snap.deliveries}):
        deliveries.add_metric([outcome], snap.deliveries.get(outcome, 0))
    yield deliveries
    budgets = GaugeMetricFamily(
        "billing_budget_remaining_usd",
        "What a budget in force has left this period, in USD.",
        labels=["budget_id"],
    )
    for budget_id, remaining in snap.budgets_remaining.items():
        budgets.add_metric([budget_id], _sample(remaining))
    yield budgets


class LedgerCollector(Collector):
    """Reads the ledger's figures from the database at every scrape; a database that does not
    answer leaves them out of that scrape (the process's own metrics are still served)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        settings: Settings,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self._settings
        try:
            with read_transaction(self._sessions) as session:
                snap = snapshot(
                    session,
                    self._clock(),
                    s.settle_after_s,
                    s.metrics_max_models,
                    s.metrics_max_budgets,
                )
        except SQLAlchemyError as error:
            log.warning("metrics: the ledger's figures are left out: %s", error)
            return
        yield from families(snap)
