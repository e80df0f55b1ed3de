"""What the rollups' SQL shares on both databases: the token column lists, the upsert's
arithmetic, and the drift rollup's writes over each database's statements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from sqlalchemy.orm import Session

from billing.dimensions import TOKEN_FIELDS
from billing.rollups.rows import COUNT_FIELDS, PICO

#: The token columns.
TOKENS = ", ".join(TOKEN_FIELDS)
#: The sums of the token columns.
TOKEN_SUMS = ", ".join(f"sum({name})" for name in TOKEN_FIELDS)
#: The sums of a rollup row's counts.
COUNT_SUMS = ", ".join(f"sum({name})" for name in COUNT_FIELDS)


def added_on_conflict(table: str, mod: str) -> str:
    """The ``SET`` list of an upsert that adds a row into the rollup ``table``: every count
    summed, the cost with its carry into whole dollars; ``mod`` is SQL's ``%`` as the driver
    wants it written."""
    counts = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in COUNT_FIELDS)
    money = []
    for name in ("cost", "charge"):
        frac = f"({table}.{name}_frac_pusd + excluded.{name}_frac_pusd)"
        money.append(
            f"{name}_frac_pusd = {frac} {mod} {PICO}, {name}_whole_usd = "
            f"{table}.{name}_whole_usd + excluded.{name}_whole_usd + {frac} / {PICO}"
        )
    return f"{counts}, {', '.join(money)}"


class DriftCore:
    """The drift rollup's ``add_drift`` and ``rebuild_drift`` over a dialect's ``ADD_DRIFT``,
    ``CLEAR_DRIFT``, ``REBUILD_DRIFT`` and ``REBUILD_DRIFT_DAYS`` statements."""

    ADD_DRIFT: ClassVar[str]
    CLEAR_DRIFT: ClassVar[str]
    REBUILD_DRIFT: ClassVar[str]
    REBUILD_DRIFT_DAYS: ClassVar[str]

    def add_drift(self, session: Session, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:
            session.connection().exec_driver_sql(self.ADD_DRIFT, list(rows))

    def rebuild_drift(self, session: Session) -> None:
        conn = session.connection()
        conn.exec_driver_sql(self.CLEAR_DRIFT)
        conn.exec_driver_sql(self.REBUILD_DRIFT)
        conn.exec_driver_sql(self.REBUILD_DRIFT_DAYS)
