"""The provider reports' SQL on SQLite (``billing.providers.repository``).

Built with SQLAlchemy on the ORM tables (times through ``UTCDateTime``); the version insert is
SQLite's ``INSERT … ON CONFLICT DO NOTHING RETURNING``, under the write lock of the caller's
``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

from sqlalchemy.dialects.sqlite import insert

from billing.providers.sql.common import ProvidersCore


class SqliteProviders(ProvidersCore):
    """``ProvidersRepository`` on SQLite."""

    insert = staticmethod(insert)
