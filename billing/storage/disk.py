"""The file of a SQLite database, and the free space where it lives (``/readyz`` reports a
full disk).

SQLite writes its file, its journal and its write-ahead log beside each other; when the disk
fills, every write fails (``SQLITE_FULL``, answered 503 as an outage) while reads go on, so a
readiness that only reads would stay 200. ``free_bytes`` gives the free space of the database's
directory (for the unprivileged user); PostgreSQL reports its own disk, and has None here.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from sqlalchemy.engine import Engine, make_url


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite database URL; None for PostgreSQL or an in-memory database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


def free_bytes(engine: Engine) -> int | None:
    """Bytes free for this user in the SQLite database file's directory; None for PostgreSQL,
    an in-memory database or a directory that cannot be read."""
    url = engine.url
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    try:
        folder = Path(url.database).resolve().parent
        stats = os.statvfs(folder)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def is_disk_full(error: BaseException) -> bool:
    """Whether a database error is SQLite's ``SQLITE_FULL`` (the disk, or the file's size
    limit, is full): an outage to answer 503, logged as a full disk."""
    orig = getattr(error, "orig", error)
    code = getattr(orig, "sqlite_errorcode", None) if isinstance(orig, sqlite3.Error) else None
    return code is not None and code & 0xFF == sqlite3.SQLITE_FULL
