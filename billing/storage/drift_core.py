"""The drift rollup's writes both databases share (``billing.drift.repository.DriftRepository``):
each database's module gives its own statements as class attributes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from sqlalchemy.orm import Session


class DriftCore:
    """``add`` and ``rebuild`` over a dialect's ``ADD``, ``CLEAR``, ``REBUILD`` and
    ``REBUILD_DAYS`` statements."""

    ADD: ClassVar[str]
    CLEAR: ClassVar[str]
    REBUILD: ClassVar[str]
    REBUILD_DAYS: ClassVar[str]

    def add(self, session: Session, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:
            session.connection().exec_driver_sql(self.ADD, list(rows))

    def rebuild(self, session: Session) -> None:
        conn = session.connection()
        conn.exec_driver_sql(self.CLEAR)
        conn.exec_driver_sql(self.REBUILD)
        conn.exec_driver_sql(self.REBUILD_DAYS)
