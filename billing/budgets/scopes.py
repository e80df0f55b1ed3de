"""Which calls and holds a budget counts, and over which span (CONTRACT "Budgets and alerts
(v2)", "Authorizations and holds (v3)"): pure functions over a budget version (a row of
``budgets`` or its copy, ``billing.budgets.rows.BudgetDef``).

A budget over a key or a customer, with a calendar period and no model, is kept in counters by
the reconciler's steps (``kept_by_counters``); a v3 budget (a tag, every call, a model, a
rolling window) is read from the calls at the time asked (``billing.budgets.spent``), its alerts
checked after the steps that write its calls (``billing.budgets.summed``).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any, Protocol

from billing.budgets.periods import period_bounds


class Scoped(Protocol):
    """What these functions read of a budget version."""

    @property
    def api_key_id(self) -> str | None: ...
    @property
    def customer_id(self) -> str | None: ...
    @property
    def tag(self) -> str | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def period(self) -> str: ...
    @property
    def tz(self) -> str: ...
    @property
    def window_s(self) -> int | None: ...


def kept_by_counters(budget: Scoped) -> bool:
    """A budget whose spend the reconciler keeps in counters (``billing.budgets.counters``)."""
    return (
        (budget.api_key_id is not None or budget.customer_id is not None)
        and budget.model is None
        and budget.period != "rolling"
    )


def scope_json(budget: Scoped) -> dict[str, Any]:
    """The budget's ``scope`` as answered."""
    if budget.api_key_id is not None:
        return {"api_key_id": budget.api_key_id}
    if budget.customer_id is not None:
        return {"customer_id": budget.customer_id}
    if budget.tag is not None:
        return {"tag": budget.tag}
    return {"all": True}


def model_matches(pattern: str | None, model: str | None) -> bool:
    """``model`` is the budget's model, or starts with its prefix (``"claude-*"``); a budget
    without one takes every model."""
    if pattern is None:
        return True
    if model is None:
        return False
    if pattern.endswith("*"):
        return model.startswith(pattern[:-1])
    return model == pattern


def tags_of(text: str | None) -> list[str]:
    """The tags of a ``stream.started`` metadata value: comma-separated, each trimmed."""
    if not text:
        return []
    return [t.strip() for t in text.split(",") if t.strip()]


def applies(
    budget: Scoped,
    key: str | None,
    customer: str | None,
    tags: Collection[str],
    model: str | None,
    any_model: bool = False,
) -> bool:
    """The budget counts a call (or a hold) of ``key``, ``customer``, ``tags`` and ``model``;
    with ``any_model`` its model is not asked (the spend check names no model)."""
    if budget.api_key_id is not None:
        found = budget.api_key_id == key
    elif budget.customer_id is not None:
        found = customer is not None and budget.customer_id == customer
    elif budget.tag is not None:
        found = budget.tag in tags
    else:
        found = True
    return found and (any_model or model_matches(budget.model, model))


def span(budget: Scoped, now: datetime) -> tuple[datetime, datetime | None]:
    """The budget's current period: ``[start, end)`` of its calendar period, or a rolling
    window's ``(now − window_s, now]`` (as ``(start, now)``: its start is left out)."""
    if budget.period == "rolling":
        assert budget.window_s is not None
        return now - timedelta(seconds=budget.window_s), now
    return period_bounds(budget.period, budget.tz, now)
