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

from collections.abc import Iterable

from sqlalchemy.orm import Session

from billing.pricing.prices import PriceBook
from billing.pricing.repository import repository
from billing.storage.copies import VersionedCopies

#: (the models, sorted) → their (count, highest id) pairs and the book of their rows; at most
#: 256 model sets an engine (the spend check asks for the models of the calls not yet stepped:
#: a few sets in practice).
_books: VersionedCopies[PriceBook] = VersionedCopies(most=256)


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
    return _books.get(
        session, wanted, versions, lambda: PriceBook(repo.rows_of_models(session, wanted))
    )
