"""The rows that cross the call log's repository (``billing.calllog.repository``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RollupSlice:
    """Which rollup rows a usage query sums, and by what.

    ``by_key``: read ``usage_rollups`` (needed for a key filter or an ``api_key_id`` dimension;
    (0021) ``usage_rollups_by_key`` when no model is filtered or grouped by), else
    ``usage_rollups_all_keys``; ``basis``: ``call_start`` or ``booked``; ``api_key_id`` and
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
    #: (v3, the console's pages) Only these keys' rows, when not None (``usage_rollups``).
    api_key_ids: tuple[str, ...] | None = None
    #: (v3, the console's pages) Only these customers' rows, when not None (``usage_rollups``).
    customer_ids: tuple[str, ...] | None = None


#: Rows of sums (see ``CalllogRepository.rollup_sums``).
Sums = Iterable[Sequence[Any]]
