"""What ``/metrics`` reports of the ledger (CONTRACT "Observability and standard exports (v3)"),
read from the database at scrape time, so that every ``billing serve`` process of one database
reports the same exact totals (in-process counters would each count their own share and lose it
at a restart).

The label sets are bounded whatever clients send: the ``max_models`` models of the highest cost
(then the most tokens) keep their own labels and every other model is summed under
``model="_other"``, so the totals stay exact; ``max_budgets`` budgets (by ``budget_id``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy.orm import Session

from billing.budgets.service import statuses_in_force
from billing.observe.repository import repository
from billing.observe.rows import ModelTotals

#: The label of the models summed together past ``max_models``.
OTHER = "_other"
#: The provider label of a model served by more than one provider.
MIXED = "_mixed"


@dataclass(frozen=True)
class Snapshot:
    """One scrape's figures: totals by (model, provider), the reconciler's lag in seconds, the
    webhook outbox by state, and the remaining amount of the first budgets in force."""

    by_model: dict[tuple[str, str], ModelTotals]
    lag: timedelta
    deliveries: dict[str, int]
    budgets_remaining: dict[str, Decimal]


def _provider_of(pairs: list[tuple[str, str]]) -> dict[str, str]:
    seen: dict[str, set[str]] = {}
    for model, provider in pairs:
        if provider:
            seen.setdefault(model, set()).add(provider)
    return {model: (next(iter(p)) if len(p) == 1 else MIXED) for model, p in seen.items()}


def _bounded(
    totals: dict[str, ModelTotals], providers: dict[str, str], max_models: int
) -> dict[tuple[str, str], ModelTotals]:
    def weight(item: tuple[str, ModelTotals]) -> tuple[int, int, str]:
        model, t = item
        return (-abs(t.cost_pusd), -sum(abs(v) for v in t.tokens.values()), model)

    ranked = sorted(totals.items(), key=weight)
    out: dict[tuple[str, str], ModelTotals] = {}
    for model, t in ranked[:max_models]:
        out[(model, providers.get(model, ""))] = t
    if len(ranked) > max_models:
        other = out.setdefault((OTHER, OTHER), ModelTotals())
        for _model, t in ranked[max_models:]:
            other.add(t)
    return out


def snapshot(
    session: Session, now: datetime, settle_after_s: float, max_models: int, max_budgets: int
) -> Snapshot:
    """The figures of one scrape, in one read transaction."""
    repo = repository(session)
    cutoff = now - timedelta(seconds=settle_after_s)
    pending, quiet = repo.oldest_due(session, cutoff)
    lags = [timedelta(0)]
    if pending is not None:
        lags.append(now - pending)
    if quiet is not None:
        lags.append(cutoff - quiet)
    budgets = statuses_in_force(session, now, max_budgets) if max_budgets else []
    return Snapshot(
        by_model=_bounded(
            repo.model_totals(session), _provider_of(repo.model_providers(session)), max_models
        ),
        lag=max(lags),
        deliveries=repo.deliveries_by_state(session),
        budgets_remaining={b["budget_id"]: Decimal(b["remaining_usd"]) for b in budgets},
    )
