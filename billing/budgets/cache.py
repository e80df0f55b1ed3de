"""The budget versions in force, kept in memory per process and database (CONTRACT "Budgets and
alerts (v2)"): a reconciliation step and the spend check look them up by key and by customer
without reading ``budgets``.

Every write of ``budgets`` bumps ``budget_generation`` in its transaction
(``BudgetsRepository.insert_budget`` / ``end_budget``); a reader reads that number (one row, or
in the spend check's own statement) and loads the versions again, in the same session, when it
is not the one its copy was loaded at. The generation is read before the versions (the same
snapshot in a step's or a read transaction; a later one in the spend check's autocommit), so a
copy is never older than the number it is kept under: another process's or replica's write is
seen by the next step or check that starts after it committed.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from billing.budgets.repository import repository
from billing.budgets.rows import BudgetDef
from billing.budgets.scopes import kept_by_counters


@dataclass(frozen=True, slots=True)
class Summed:
    """The versions in force that no counter keeps (v3: a tag, every call, a model, a rolling
    window), by what a call is matched on (its key, its customer, each of its tags; ``every``:
    the ``{"all": true}`` ones), and the rolling ones (``billing.budgets.summed``: their alerts).
    Each list by ``budget_id``; the model filter is the caller's to apply."""

    by_key: dict[str, list[BudgetDef]] = field(default_factory=dict)
    by_customer: dict[str, list[BudgetDef]] = field(default_factory=dict)
    by_tag: dict[str, list[BudgetDef]] = field(default_factory=dict)
    every: list[BudgetDef] = field(default_factory=list)
    rolling: list[BudgetDef] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.by_key or self.by_customer or self.by_tag or self.every)

    def add(self, budget: BudgetDef) -> None:
        if budget.api_key_id is not None:
            self.by_key.setdefault(budget.api_key_id, []).append(budget)
        elif budget.customer_id is not None:
            self.by_customer.setdefault(budget.customer_id, []).append(budget)
        elif budget.tag is not None:
            self.by_tag.setdefault(budget.tag, []).append(budget)
        else:
            self.every.append(budget)
        if budget.period == "rolling":
            self.rolling.append(budget)

    def over(self, key: str | None, customer: str | None, tags: Iterable[str]) -> list[BudgetDef]:
        """The versions over a call of ``key``, ``customer`` and ``tags`` (any model; each
        once)."""
        found = list(self.every)
        if key is not None:
            found += self.by_key.get(key, ())
        if customer is not None:
            found += self.by_customer.get(customer, ())
        for tag in set(tags):
            found += self.by_tag.get(tag, ())
        return found


@dataclass(frozen=True, slots=True)
class InForce:
    """The versions in force at ``generation``: by row id; those the counters keep by key and
    by customer (each list by ``budget_id``); the others (v3: a tag, every call, a model, a
    rolling window; ``billing.budgets.scopes.kept_by_counters``), read from the calls:
    ``summed``."""

    generation: int | None
    by_row: dict[int, BudgetDef]
    by_key: dict[str, list[BudgetDef]]
    by_customer: dict[str, list[BudgetDef]]
    summed: Summed = field(default_factory=Summed)

    @classmethod
    def of(cls, generation: int | None, found: Iterable[BudgetDef]) -> InForce:
        by_row: dict[int, BudgetDef] = {}
        by_key: dict[str, list[BudgetDef]] = {}
        by_customer: dict[str, list[BudgetDef]] = {}
        summed = Summed()
        for budget in sorted(found, key=lambda b: b.budget_id):
            by_row[budget.id] = budget
            if not kept_by_counters(budget):
                summed.add(budget)
                continue
            if budget.api_key_id is not None:
                by_key.setdefault(budget.api_key_id, []).append(budget)
            elif budget.customer_id is not None:
                by_customer.setdefault(budget.customer_id, []).append(budget)
        return cls(generation, by_row, by_key, by_customer, summed)

    def over(self, key: str | None, customer: str | None) -> list[BudgetDef]:
        """The versions over ``key`` and over ``customer`` (either may be None)."""
        found = self.by_key.get(key, []) if key is not None else []
        if customer is not None and customer in self.by_customer:
            found = found + self.by_customer[customer]
        return found

    def near(self, key: str, customer: str | None, tags: Iterable[str]) -> list[BudgetDef]:
        """Every version that may count a call of ``key``, ``customer`` and ``tags``, kept by
        counters or not (any model: ``billing.budgets.spent.over`` decides), found by its
        scope rather than by reading all of them (10,000 budgets: 7 ms an authorization)."""
        return self.over(key, customer) + self.summed.over(key, customer, tags)


#: Per engine (a process may open several databases; an engine disposed and dropped takes its
#: copy with it).
_copies: weakref.WeakKeyDictionary[Engine, InForce] = weakref.WeakKeyDictionary()
_loading = threading.Lock()


def _engine(session: Session) -> Engine:
    bind = session.get_bind()
    engine: Engine = bind.engine
    return engine


def copy_of(engine: Engine) -> InForce | None:
    """The copy kept for ``engine`` as it is (None before the first load), without a statement:
    possibly older than the database's generation (``billing.budgets.summed.on_pass``)."""
    return _copies.get(engine)


def in_force(session: Session) -> InForce:
    """The versions in force as ``session`` sees them (the generation read first, then, when the
    copy is of another one, the versions, in ``session``)."""
    return in_force_at(session, repository(session).generation(session))


def in_force_at(session: Session, generation: int | None) -> InForce:
    """``in_force`` with ``generation`` just read in this transaction (before anything else of
    the budgets)."""
    engine = _engine(session)
    copy = _copies.get(engine)
    # A missing row (None) is never trusted: the versions are read every time until a write
    # puts the row back.
    if copy is not None and generation is not None and copy.generation == generation:
        return copy
    fresh = InForce.of(generation, repository(session).definitions(session))
    with _loading:
        _copies[engine] = fresh
    return fresh
