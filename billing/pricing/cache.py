"""The prices of a few models kept in memory per process and database, for the lookups on the
authorization's path (CONTRACT "Authorizations and holds (v3)": the estimate's price in force
now; ``billing.budgets.spent``: the estimates of calls not yet stepped).

Prices are effective-dated and posted at any time, by any process or replica sharing the
database, so a copy is never trusted by its age: each lookup first reads, per model asked, how
many price rows it has and their highest id (``PricingRepository.model_versions``: one
statement over the prices' identity index), and loads the models' rows again, in the same
session, when that is not what its copy was loaded at. Prices are only ever inserted (a new
``effective_from``; never changed, never deleted), so every row committed since the copy,
whatever the order its id was drawn in, changes its model's count. The numbers are read before
the rows (the same snapshot in a write transaction; a later one under read committed), so a
copy is never older than the numbers it is kept under: a price committed by another process
before an authorization began is the price that authorization uses.

A transaction that inserts prices itself must not look them up here (its rows, if it rolled
back, could be kept under numbers a later insert reaches again): the authorization and the
spend check never write prices.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from billing.pricing.prices import PriceBook
from billing.pricing.repository import repository

#: (the models, sorted) → (their (count, highest id) pairs, the book of their rows).
_Books = dict[tuple[str, ...], tuple[tuple[tuple[int, int] | None, ...], PriceBook]]

#: Per engine (a process may open several databases; an engine dropped takes its copies).
_copies: weakref.WeakKeyDictionary[Engine, _Books] = weakref.WeakKeyDictionary()
_lock = threading.Lock()

#: Model sets kept per engine at most (the spend check asks for the models of the calls not yet
#: stepped: a few sets in practice); beyond, every copy is dropped and loaded again on demand.
MAX_SETS = 256


def _engine(session: Session) -> Engine:
    engine: Engine = session.get_bind().engine
    return engine


def price_book(
    session: Session,
    models: Iterable[str],
    known: dict[str, tuple[int, int]] | None = None,
) -> PriceBook:
    """``billing.pricing.service.price_book``: the prices of ``models`` as ``session`` sees
    them, from this process's copy when no price of theirs was added since it was loaded.
    ``known``: ``model_versions``' answer for ``models`` read already by a statement of this
    session (the authorization's spend check), before any rows loaded here; else read here."""
    wanted = tuple(sorted(set(models)))
    if not wanted:
        return PriceBook([])
    repo = repository(session)
    found = repo.model_versions(session, wanted) if known is None else known
    versions = tuple(found.get(model) for model in wanted)
    engine = _engine(session)
    books = _copies.get(engine)
    kept = None if books is None else books.get(wanted)
    if kept is not None and kept[0] == versions:
        return kept[1]
    book = PriceBook(repo.rows_of_models(session, wanted))
    with _lock:
        books = _copies.setdefault(engine, {})
        if len(books) >= MAX_SETS:
            books.clear()
        books[wanted] = (versions, book)
    return book
