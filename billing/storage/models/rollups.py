"""The rollups kept by the reconciler: usage per quarter hour and key, and the drift's ours."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Index,
    SmallInteger,
    String,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from billing.storage.models.base import (
    AFTER_TOKENS,
    Base,
    TokenColumns,
    counter,
)
from billing.storage.types import UTCDateTime


class _RollupTotals(TokenColumns):
    """The summed columns shared by both rollup tables (see ``UsageRollup``): the counts, the
    token columns, then the cost and the unpriced count."""

    members: Mapped[int] = counter()
    calls: Mapped[int] = counter()
    cost_whole_usd: Mapped[int] = counter(sort_order=AFTER_TOKENS)
    cost_frac_pusd: Mapped[int] = counter(sort_order=AFTER_TOKENS)
    unpriced: Mapped[int] = counter(sort_order=AFTER_TOKENS)
    #: (v2) The charge, split as the cost is, and the contributions without a charge (CONTRACT
    #: "Keys, customers and plans (v2)").
    charge_whole_usd: Mapped[int] = counter(sort_order=AFTER_TOKENS + 1)
    charge_frac_pusd: Mapped[int] = counter(sort_order=AFTER_TOKENS + 1)
    uncharged: Mapped[int] = counter(sort_order=AFTER_TOKENS + 1)
    #: (v3) The cost that charge policies for failed calls left uncharged, split as the cost is
    #: (CONTRACT "Charge policy for failed calls (v3)").
    leakage_whole_usd: Mapped[int] = counter(sort_order=AFTER_TOKENS + 2)
    leakage_frac_pusd: Mapped[int] = counter(sort_order=AFTER_TOKENS + 2)


class UsageRollup(_RollupTotals, Base):
    """Pre-aggregated usage per (basis, api key, level, UTC bucket, model, customer).

    See billing.rollups.service.

    ``basis`` is ``call_start`` (settled calls with their current figures, in the bucket of the
    call's start) or ``booked`` (ledger entries, in the bucket of ``booked_at``). ``level`` is the
    bucket width: 0 = 15 minutes, 1 = hour, 2 = day, 3 = month, all aligned in UTC. A null key or
    model is stored as ``''`` (real ones have at least one character). ``members`` counts the
    contributing calls (call_start) or ledger entries (booked); ``calls`` counts calls, or
    settlement entries; ``unpriced`` those without a cost. The cost is exact picodollars split as
    ``cost_whole_usd * 10**12 + cost_frac_pusd`` (0 <= frac < 10**12) so that a bucket never
    overflows a 64-bit integer.
    """

    __tablename__ = "usage_rollups"

    basis: Mapped[str] = mapped_column(String(16), primary_key=True)
    api_key_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    #: (v2) The customer the contributions were charged to ('' for none).
    customer_id: Mapped[str] = mapped_column(
        String(128), primary_key=True, server_default=text("''")
    )

    __table_args__ = (
        Index(None, "basis", "level", "bucket_start"),
        # (v2) A customer's rows (GET /v1/usage?customer_id=, group_by=customer_id).
        Index(None, "basis", "customer_id", "level", "bucket_start"),
    )


class UsageRollupAllKeys(_RollupTotals, Base):
    """``UsageRollup`` summed over every api key: what queries not about one key read."""

    __tablename__ = "usage_rollups_all_keys"

    basis: Mapped[str] = mapped_column(String(16), primary_key=True)
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)


class UsageRollupByKey(_RollupTotals, Base):
    """(0021) ``UsageRollup`` summed over every model: per (basis, api key, level, UTC bucket,
    customer). What the queries that neither filter nor group by model read (the console's
    Overview ranks keys and customers by it, the Customers page sums a page of customers):
    about a model count fewer rows than ``usage_rollups``. Kept with the others by
    ``billing.rollups.service.Deltas``; a null key or customer is ``''``."""

    __tablename__ = "usage_rollups_by_key"

    #: The key in this order: a period's rows are one range of it (the Overview's rankings read
    #: every row of a period), and on SQLite the table is that key's b-tree (``WITHOUT
    #: ROWID``): a range is read in place, not looked up row by row from an index.
    basis: Mapped[str] = mapped_column(String(16), primary_key=True)
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    api_key_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    customer_id: Mapped[str] = mapped_column(String(128), primary_key=True)

    __table_args__ = (
        # A page of keys, or of customers (and ``GET /v1/usage``'s key or customer filter).
        Index(None, "basis", "api_key_id", "level", "bucket_start"),
        Index(None, "basis", "customer_id", "level", "bucket_start"),
        {"sqlite_with_rowid": False},
    )


class UsageRollupByCustomer(_RollupTotals, Base):
    """(0021) ``UsageRollupByKey`` summed over every key: per (basis, level, UTC bucket,
    customer), what the queries about customers only read (the Overview's top customers, the
    Customers page): a customer's day is one row, however many keys it has. The key's order and
    ``WITHOUT ROWID`` as ``UsageRollupByKey``'s; ``''`` for no customer."""

    __tablename__ = "usage_rollups_by_customer"

    basis: Mapped[str] = mapped_column(String(16), primary_key=True)
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    customer_id: Mapped[str] = mapped_column(String(128), primary_key=True)

    __table_args__ = (
        # (Named: the convention's name is longer than PostgreSQL's 63 characters.)
        Index(
            "ix_usage_rollups_by_customer_customer_id",
            "basis",
            "customer_id",
            "level",
            "bucket_start",
        ),
        {"sqlite_with_rowid": False},
    )


class CallStatusRollup(Base):
    """(0021) The settled calls by status (``completed``, ``client_disconnected``, ``failed``)
    per UTC bucket of their start, placed as the call_start rollups place them (``level`` and
    ``bucket_start`` as ``UsageRollup``'s): the console's Overview counts the statuses of a
    period from it (the open calls, never rolled up, from ``calls``). Kept by
    ``billing.rollups.service.Deltas``."""

    __tablename__ = "call_status_rollups"

    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    status: Mapped[str] = mapped_column(String(32), primary_key=True)
    calls: Mapped[int] = counter()


class UsageRollupKeyless(Base):
    """Where a settled call without ``stream.started`` sits in the call_start rollups.

    Ingest fills in the key, model and start of a key-less call when its ``stream.started``
    arrives late, before the reconciler runs; this remembers the start it was rolled up under, so
    the reconciler can take that contribution back (its key and model were null).
    """

    __tablename__ = "usage_rollup_keyless"

    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class DriftRollup(Base):
    """The drift's "ours" (``billing.drift``) per UTC hour (``level`` 0) and UTC day (``level``
    1) of the calls' start, provider, model, upstream account and served tier, kept by the
    reconciler (``billing.rollups.drift``).

    It sums the settled calls that have a ``stream.started`` (the others are read from
    ``calls`` by the drift: open calls, and the key-less ones listed in
    ``usage_rollup_keyless``, whose start and labels ingest may still change): ``calls`` counts
    them, ``requests`` their upstream attempts (at least one each), the tokens as the drift
    reports them (``output_tokens`` = billed output), the cost in picodollars as
    ``cost_whole_usd * 10**12 + cost_frac_pusd`` (each the sum of the calls' own: ``frac`` is
    not carried, it stays below ``calls * 10**12``), ``unpriced_calls`` the calls without a
    cost (an unpriced call: the group's cost is then unknown). A null label is stored as ``''``.
    """

    __tablename__ = "drift_rollups"

    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    provider: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    upstream_account: Mapped[str] = mapped_column(String(128), primary_key=True)
    service_tier: Mapped[str] = mapped_column(String(32), primary_key=True)
    calls: Mapped[int] = counter()
    requests: Mapped[int] = counter()
    input_tokens: Mapped[int] = counter()
    cache_read_input_tokens: Mapped[int] = counter()
    cache_creation_input_tokens: Mapped[int] = counter()
    output_tokens: Mapped[int] = counter()
    cost_whole_usd: Mapped[int] = counter()
    cost_frac_pusd: Mapped[int] = counter()
    unpriced_calls: Mapped[int] = counter()
