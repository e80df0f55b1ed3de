"""The SQL of the call log's usage queries that differs by database, as a ``Protocol``:
``billing.storage.sqlite.calllog`` and ``billing.storage.postgres.calllog`` implement it;
``store_for(session).calllog`` picks one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from sqlalchemy.orm import Session

from billing.rollups.buckets import Run


class CalllogRepository(Protocol):
    """The call log's statements on one database, run in the session's transaction."""

    def rollup_sums(
        self,
        session: Session,
        runs: Sequence[Run],
        *,
        by_key: bool,
        basis: str,
        api_key_id: str | None,
        model: str | None,
        dims: Sequence[str],
    ) -> Iterable[Sequence[Any]]:
        """The rollup rows of ``basis`` inside each of the ``runs`` (a run: one level, a range of
        bucket starts), summed per (run's ``seg``, ``dims``): rows ``(seg, *dims,
        *COUNT_FIELDS, cost_whole_usd, cost_frac_pusd)``, sums as the database gives them (null
        for no row), ``''`` for a null key or model. ``by_key`` reads ``usage_rollups`` (needed
        for a key filter or an ``api_key_id`` dimension), else ``usage_rollups_all_keys``;
        ``api_key_id`` and ``model`` filter when given. Each run is one range of the table's
        primary key."""
