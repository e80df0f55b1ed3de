"""The archive on SQLite: ``CoreArchive`` as it is. A write transaction (``BEGIN IMMEDIATE``)
holds the one write lock, so no event is stored while a month is read and removed; an
archived event's id is forgotten (SQLite keeps no ``event_ids``: ``docs/SCALE.md``)."""

from __future__ import annotations

from billing.archive.sql.common import CoreArchive


class SqliteArchive(CoreArchive):
    """``ArchiveRepository`` on SQLite."""
