"""The SQL of the call log's usage queries that differs by database, as a ``Protocol``:
``billing.storage.sqlite.calllog`` and ``billing.storage.postgres.calllog`` implement it;
``store_for(session).calllog`` picks one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from billing.rollups.buckets import Run


@dataclass(frozen=True, slots=True)
class RollupSlice:
    """Which rollup rows a usage query sums, and by what.

    ``by_key``: read ``usage_rollups`` (needed for a key filter or an ``api_key_id`` dimension),
    else ``usage_rollups_all_keys``; ``basis``: ``call_start`` or ``booked``; ``api_key_id`` and
    ``model``: filters, when not None; ``dims``: the group-by dimensions among ``api_key_id`` and
    ``model``, in order.
    """

    by_key: bool
    basis: str
    api_key_id: str | None
    model: str | None
    dims: tuple[str, ...]
    #: (v2) A customer filter, when not None (only on ``usage_rollups``).
    customer_id: str | None = None


#: Rows of sums (see ``CalllogRepository.rollup_sums``).
Sums = Iterable[Sequence[Any]]


class CalllogRepository(Protocol):
    """The call log's statements on one database, run in the session's transaction."""

    def rollup_sums(self, session: Session, runs: Sequence[Run], rows: RollupSlice) -> Sums:
        """The rollup ``rows`` inside each of the ``runs`` (a run: one level, a range of bucket
        starts), summed per (run's ``seg``, ``rows.dims``): ``(seg, *dims, *COUNT_FIELDS,
        cost_whole_usd, cost_frac_pusd, charge_whole_usd, charge_frac_pusd)``, sums as the
        database gives them (null for no row), ``''`` for a null key, model or customer. Each run
        is one range of the table's primary key."""

    def units_in(
        self,
        session: Session,
        basis: str,
        since: datetime,
        until: datetime,
        api_key_id: str | None,
        model: str | None,
        customer_id: str | None = None,
    ) -> list[Any]:
        """(v2) ``(at, api_key_id, model, units, customer_id)`` of every settled call
        (``call_start``: at its start) or ledger entry (``booked``: at its booking) in
        ``[since, until)`` that has units, with the key, model and customer filters; ``units``
        as stored (name → count)."""
        ...
