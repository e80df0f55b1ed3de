"""What the rollups' SQL shares on both databases: the token column lists, the upsert's
arithmetic, the rebuild's statements, and the drift rollup's writes over each database's
statements."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from sqlalchemy.orm import Session

from billing.anomalies import STARTED_MISSING
from billing.dimensions import TOKEN_FIELDS
from billing.rollups.buckets import DAY, HOUR, MONTH, QUARTER
from billing.rollups.rows import BOOKED, CALL_START, COUNT_FIELDS, PICO, ROLLUP_SUMMED

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
    for name in ("cost", "charge", "leakage"):
        frac = f"({table}.{name}_frac_pusd + excluded.{name}_frac_pusd)"
        money.append(
            f"{name}_frac_pusd = {frac} {mod} {PICO}, {name}_whole_usd = "
            f"{table}.{name}_whole_usd + excluded.{name}_whole_usd + {frac} / {PICO}"
        )
    return f"{counts}, {', '.join(money)}"


def rebuild_statements(mod: str, true: str, floor: Callable[[int, str], str]) -> tuple[str, ...]:
    """``RollupsRepository.rebuild``'s statements in a database's dialect: empty the usage
    rollups, then sum the settled calls (call_start) and the ledger entries (booked) per quarter
    hour, the quarters into the coarser levels, the levels over every key and (0021) over every
    model (and every key), count the settled calls by status per quarter and level, and
    remember the key-less calls. ``mod``: SQL's ``%`` as the driver wants it written;
    ``true``: the boolean true of ``calls.settled``; ``floor(level, column)``: the SQL of the
    UTC bucket of a timestamp column (``billing.rollups.buckets.floor``)."""
    keyless = f"CAST(anomalies AS TEXT) LIKE '{mod}\"{STARTED_MISSING}\"{mod}'"

    def split(column: str) -> str:
        # The whole dollars and picodollars of the signed sum of ``column`` (null as 0).
        total = f"sum(coalesce({column}, 0))"
        return (
            f"({total} - ({total} {mod} {PICO} + {PICO}) {mod} {PICO}) / {PICO}, "
            f"({total} {mod} {PICO} + {PICO}) {mod} {PICO}"
        )

    def carried(money: str) -> str:
        # The sums of ``money``'s whole and fraction columns, the fraction's carry moved.
        frac = f"sum({money}_frac_pusd)"
        return (
            f"sum({money}_whole_usd) + ({frac} - {frac} {mod} {PICO}) / {PICO}, {frac} {mod} {PICO}"
        )

    summed = ", ".join(ROLLUP_SUMMED)
    keyed = (
        "INSERT INTO usage_rollups (basis, api_key_id, level, bucket_start, model, customer_id, "
        f"{summed}) "
    )
    quarters = (
        keyed + f"SELECT basis, api_key_id, {QUARTER}, {floor(QUARTER, 'at')}, model, customer_id, "
        f"count(*), sum(calls), {TOKEN_SUMS}, sum(CASE WHEN cost_pusd IS NULL THEN 1 ELSE 0 END), "
        "sum(CASE WHEN charge_pusd IS NULL THEN 1 ELSE 0 END), "
        f"{split('cost_pusd')}, {split('charge_pusd')}, {split('leakage_pusd')} "
        f"FROM (SELECT '{CALL_START}' AS basis, started_at AS at, "
        f"CASE WHEN {keyless} THEN '' ELSE coalesce(api_key_id, '') END AS api_key_id, "
        f"CASE WHEN {keyless} THEN '' ELSE coalesce(model, '') END AS model, "
        f"CASE WHEN {keyless} THEN '' ELSE coalesce(customer_id, '') END AS customer_id, "
        f"1 AS calls, {TOKENS}, cost_pusd, charge_pusd, leakage_pusd "
        f"FROM calls WHERE settled IS {true} AND started_at IS NOT NULL "
        f"UNION ALL SELECT '{BOOKED}', booked_at, coalesce(api_key_id, ''), coalesce(model, ''), "
        f"coalesce(customer_id, ''), CASE WHEN kind = 'settlement' THEN 1 ELSE 0 END, {TOKENS}, "
        "cost_pusd, charge_pusd, leakage_pusd FROM ledger_entries) AS source "
        "GROUP BY basis, api_key_id, 4, model, customer_id"
    )
    levels = [
        keyed + f"SELECT basis, api_key_id, {level}, {floor(level, 'bucket_start')}, model, "
        f"customer_id, {COUNT_SUMS}, {carried('cost')}, {carried('charge')}, "
        f"{carried('leakage')} "
        f"FROM usage_rollups WHERE level = {QUARTER} "
        "GROUP BY basis, api_key_id, 4, model, customer_id"
        for level in (HOUR, DAY, MONTH)
    ]
    all_keys = (
        f"INSERT INTO usage_rollups_all_keys (basis, level, bucket_start, model, {summed}) "
        f"SELECT basis, level, bucket_start, model, {COUNT_SUMS}, {carried('cost')}, "
        f"{carried('charge')}, {carried('leakage')} FROM usage_rollups "
        "GROUP BY basis, level, bucket_start, model"
    )
    by_key = (
        f"INSERT INTO usage_rollups_by_key (basis, api_key_id, level, bucket_start, customer_id, "
        f"{summed}) SELECT basis, api_key_id, level, bucket_start, customer_id, {COUNT_SUMS}, "
        f"{carried('cost')}, {carried('charge')}, {carried('leakage')} FROM usage_rollups "
        "GROUP BY basis, api_key_id, level, bucket_start, customer_id"
    )
    by_customer = (
        f"INSERT INTO usage_rollups_by_customer (basis, level, bucket_start, customer_id, "
        f"{summed}) SELECT basis, level, bucket_start, customer_id, {COUNT_SUMS}, "
        f"{carried('cost')}, {carried('charge')}, {carried('leakage')} FROM usage_rollups_by_key "
        "GROUP BY basis, level, bucket_start, customer_id"
    )
    statuses = "INSERT INTO call_status_rollups (level, bucket_start, status, calls) "
    status_quarters = (
        statuses + f"SELECT {QUARTER}, {floor(QUARTER, 'started_at')}, status, count(*) "
        f"FROM calls WHERE settled IS {true} AND started_at IS NOT NULL GROUP BY 2, status"
    )
    status_levels = [
        statuses + f"SELECT {level}, {floor(level, 'bucket_start')}, status, sum(calls) "
        f"FROM call_status_rollups WHERE level = {QUARTER} GROUP BY 2, status"
        for level in (HOUR, DAY, MONTH)
    ]
    keyless_calls = (
        "INSERT INTO usage_rollup_keyless (request_id, started_at) SELECT request_id, started_at "
        f"FROM calls WHERE settled IS {true} AND started_at IS NOT NULL AND {keyless}"
    )
    return (
        "DELETE FROM usage_rollups",
        "DELETE FROM usage_rollups_all_keys",
        "DELETE FROM usage_rollup_keyless",
        "DELETE FROM usage_rollups_by_key",
        "DELETE FROM usage_rollups_by_customer",
        "DELETE FROM call_status_rollups",
        quarters,
        *levels,
        all_keys,
        by_key,
        by_customer,
        status_quarters,
        *status_levels,
        keyless_calls,
    )


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
