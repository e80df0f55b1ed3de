"""The provider reports' SQL on PostgreSQL (``billing.providers.repository.ProvidersRepository``).

Built with SQLAlchemy on the ORM tables; the version insert is ``INSERT … ON CONFLICT DO NOTHING
RETURNING``: a concurrent import of the same bucket version waits for the first one's commit,
then inserts nothing (read committed: the caller's next read sees the committed version).
"""

from __future__ import annotations

from sqlalchemy.dialects.postgresql import insert

from billing.storage.providers_core import ProvidersCore


class PostgresProviders(ProvidersCore):
    """``ProvidersRepository`` on PostgreSQL."""

    insert = staticmethod(insert)


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = PostgresProviders()
