"""Request ids as SQL lists: how many go in one statement, and SQLite's ``?`` lists."""

from __future__ import annotations

import functools

#: Ids per statement on SQLite (``with_ids``; SQLite allows 32,766 parameters a statement).
CHUNK = 4000


@functools.lru_cache(maxsize=64)
def with_ids(statement: str, count: int) -> str:
    """``statement`` with its ``{ids}`` list of ``count`` parameters (one per request id)."""
    return statement.replace("{ids}", ", ".join("?" * count))
