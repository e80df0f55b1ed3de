"""The provider reports' SQL on PostgreSQL (``billing.providers.repository``).

Built with SQLAlchemy on the ORM tables; the version insert is ``INSERT … ON CONFLICT DO NOTHING
RETURNING``: a concurrent import of the same bucket version waits for the first one's commit,
then inserts nothing (read committed: the caller's next read sees the committed version).
"""

from __future__ import annotations

from sqlalchemy.dialects.postgresql import insert

from billing.providers.sql.common import ProvidersCore


class PostgresProviders(ProvidersCore):
    """``ProvidersRepository`` on PostgreSQL."""

    insert = staticmethod(insert)
