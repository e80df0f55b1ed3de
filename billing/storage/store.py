"""The storage interface: one ``Store`` per database, each room's SQL behind a repository.

Domain code never asks which database it runs on: it asks ``store_for(bind)`` for the ``Store``
of the engine behind a session, connection or engine, and calls the room's repository on it
(``store_for(session).ingest.insert_events(…)``). Each room declares its repository's methods
as a ``Protocol`` in its own ``repository.py``; ``billing.storage.sqlite`` and
``billing.storage.postgres`` implement every one of them, one module per room, each readable top
to bottom in its own dialect. The implementation is chosen once per dialect, the first time an
engine of that dialect is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from billing.budgets.repository import BudgetsRepository
    from billing.calllog.repository import CalllogRepository
    from billing.drift.repository import DriftRepository
    from billing.export.repository import ExportRepository
    from billing.ingest.repository import IngestRepository
    from billing.plans.repository import PlansRepository
    from billing.providers.repository import ProvidersRepository
    from billing.reconcile.repository import ReconcileRepository
    from billing.rollups.repository import RollupsRepository


@dataclass(frozen=True, slots=True)
class Store:
    """The repositories of one database: one attribute per room (see each room's
    ``repository.py`` for its methods)."""

    name: str
    ingest: IngestRepository
    reconcile: ReconcileRepository
    rollups: RollupsRepository
    calllog: CalllogRepository
    export: ExportRepository
    providers: ProvidersRepository
    drift: DriftRepository
    plans: PlansRepository
    budgets: BudgetsRepository


_STORES: dict[str, Store] = {}


#: The package of each database's implementations, by SQLAlchemy dialect name.
_PACKAGES = {"sqlite": "billing.storage.sqlite", "postgresql": "billing.storage.postgres"}
#: The rooms, as ``Store`` names them: each package has a module of that name.
_ROOMS = (
    "ingest",
    "reconcile",
    "rollups",
    "calllog",
    "export",
    "providers",
    "drift",
    "plans",
    "budgets",
)


def _build(dialect: str) -> Store:
    package = _PACKAGES.get(dialect)
    if package is None:
        raise ValueError(f"no store for the database {dialect!r}: use SQLite or PostgreSQL")
    rooms = {room: import_module(f"{package}.{room}").REPOSITORY for room in _ROOMS}
    return Store(name=dialect, **rooms)


def store_for(bind: Session | Connection | Engine) -> Store:
    """The ``Store`` of the database behind ``bind``; raises ``ValueError`` for a database that
    is neither SQLite nor PostgreSQL."""
    engine = bind.get_bind() if isinstance(bind, Session) else bind
    dialect = engine.dialect.name
    store = _STORES.get(dialect)
    if store is None:
        store = _STORES[dialect] = _build(dialect)
    return store
