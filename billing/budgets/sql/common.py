"""What the budgets' SQL modules share: the dialect's pieces each of them builds on."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session

from billing.storage.lists import Listed


class DialectBase:
    """A database's ``insert`` (with ``on_conflict_…``), its quarter hour and id lists, and its
    locks; ``versions``, ``counters`` and ``alerts`` build on them, each database's module
    gives them."""

    insert: Callable[..., Any]
    #: A list of ids bound as one parameter, for statements built once (``Listed``).
    listed: Listed
    #: SQL for the UTC quarter hour of an instant column (``billing.rollups.buckets.floor``).
    quarter: Callable[[Any], ColumnElement[Any]]

    def among(self, column: Any, ids: Sequence[str]) -> ColumnElement[bool]:
        """``column`` is one of ``ids``, as one bound value (a step's thousands of ids are not
        thousands of parameters)."""
        raise NotImplementedError

    # -- locks: a budget's first counter and the steps' counter updates never interleave ------

    def lock_shared(self, session: Session) -> None:
        raise NotImplementedError

    def lock_exclusive(self, session: Session) -> None:
        raise NotImplementedError
