"""The provider reports' SQL on SQLite (``billing.providers.repository.ProvidersRepository``).

Built with SQLAlchemy on the ORM tables (times through ``UTCDateTime``); the version insert is
SQLite's ``INSERT … ON CONFLICT DO NOTHING RETURNING``, under the write lock of the caller's
``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

from sqlalchemy.dialects.sqlite import insert

from billing.storage.providers_core import ProvidersCore


class SqliteProviders(ProvidersCore):
    """``ProvidersRepository`` on SQLite."""

    insert = staticmethod(insert)


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = SqliteProviders()
