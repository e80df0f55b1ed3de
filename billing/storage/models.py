"""All ORM tables of the service, in one place (the migrations are the source of the schema)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedColumn, mapped_column

from billing.dimensions import TOKEN_FIELDS
from billing.rates import PLAN_RATE_COLUMNS, RATE_COLUMNS
from billing.storage.types import UTCDateTime

# SQLite only makes an INTEGER PRIMARY KEY auto-increment; PostgreSQL gets a real bigint.
BigId = BigInteger().with_variant(Integer(), "sqlite")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base with a naming convention, so migrations name constraints alike."""

    metadata = MetaData(naming_convention=NAMING)


def _counter(**kw: Any) -> MappedColumn[int]:
    """A count that is never null and starts at 0 (tokens, calls, picodollars)."""
    return mapped_column(BigInteger, nullable=False, default=0, server_default=text("0"), **kw)


#: ``sort_order`` of a table's columns that come after its token columns (the others have 0 and
#: come before them; the mixin's columns follow a table's own columns of the same order).
AFTER_TOKENS = 1


class TokenColumns:
    """One column per token bucket (``billing.dimensions.TOKEN_FIELDS``, in its order): calls,
    call attempts, ledger entries and both rollup tables carry them. ``BIGINT NOT NULL DEFAULT
    0``; read and write them together with ``tokens_of`` / ``set_tokens``, or by name."""


for _name in TOKEN_FIELDS:
    setattr(TokenColumns, _name, _counter())


class PriceRates:
    """One column per rate of a price (``billing.rates.RATE_COLUMNS``, in its order):
    micro-USD per million tokens, ``BIGINT NOT NULL``; read them with ``PriceRow``."""


class EntryRates:
    """The rates a ledger entry was booked at (``RATE_COLUMNS``), after its ``price_id``; null
    when the entry is unpriced."""


class EntryPlanRates:
    """(v2) The plan's own rates a ledger entry was charged at (``plan_`` + ``RATE_COLUMNS``),
    after its ``plan_price_id``; null when no plan price applied (CONTRACT "Keys, customers and
    plans (v2)")."""


for _name in RATE_COLUMNS:
    setattr(PriceRates, _name, mapped_column(BigInteger, nullable=False))
    setattr(EntryRates, _name, mapped_column(BigInteger, sort_order=AFTER_TOKENS + 1))
for _name in PLAN_RATE_COLUMNS:
    setattr(EntryPlanRates, _name, mapped_column(BigInteger, sort_order=AFTER_TOKENS + 5))
del _name


class Event(Base):
    """One accepted lifecycle event, append-only (CONTRACT "Events").

    ``body`` is the event's JSON as the gateway sent it (keys and values in its order);
    ``content_hash`` is the SHA-256 of its canonical validated form, which decides whether a
    reused ``event_id`` is a duplicate (same hash) or a conflict (different hash). ``seq`` is
    arrival order. ``output_tokens_delivered`` and ``output_tokens_generated`` repeat a
    ``stream.tokens`` event's counters (tokens) from its validated body, so the reconciler folds
    a call's progress records in the database (``billing.reconcile.service.load_events``); null
    for the other types.

    ``call_no`` is the event's call's ``calls.call_no``, set by ingest: a call's events are found
    by it (index ``call_no, seq``), not by ``request_id``. A call's number is given when the call
    is first seen, so the events of the calls in flight land at the end of that index instead of
    at random places in an index of random request ids. Nullable only because PostgreSQL's
    ingest statement may insert an event of a call that another transaction created meanwhile
    without its number, and then gives it the number (or rolls back) in the same transaction
    (``billing.ingest.service``): no committed event lacks it.
    """

    __tablename__ = "events"

    seq: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(128), nullable=False, unique=True)
    request_id: Mapped[str] = mapped_column(String(128), nullable=False)
    attempt: Mapped[int] = mapped_column(Integer, nullable=False)
    type: Mapped[str] = mapped_column(String(40), nullable=False)
    occurred_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    content_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    body: Mapped[str] = mapped_column(Text, nullable=False)
    output_tokens_delivered: Mapped[int | None] = mapped_column(BigInteger)
    output_tokens_generated: Mapped[int | None] = mapped_column(BigInteger)
    #: (0012) A ``stream.usage``'s body of the reconciler's fast path's shape as far as its text
    #: goes (``billing.storage.settle_common_sql.plain_usage``), set once at ingest; null for the
    #: other types.
    plain_usage: Mapped[bool | None] = mapped_column(Boolean)
    call_no: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (Index(None, "call_no", "seq"),)


class Call(TokenColumns, Base):
    """Per-call state: ingest bookkeeping plus the reconciler's current figures.

    Ingest creates the row, or sets ``pending`` (and bumps ``change_seq``) when a call that is
    not pending gets a new event; a pending call's row is left alone by its later events. The
    reconciler recomputes the figures from the events, settles, and clears ``pending``. Token
    fields are integers (tokens); ``cost_pusd`` is the exact cost in picodollars (1e-12 USD), null
    while the model has no price.

    ``call_no`` numbers calls in the order ingest first sees them (SQLite: one more than the
    largest, under the write lock; PostgreSQL: the sequence ``calls_call_no_seq``); the call's
    events carry it (``Event.call_no``).
    """

    __tablename__ = "calls"

    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    call_no: Mapped[int] = mapped_column(BigInteger, nullable=False)
    api_key_id: Mapped[str | None] = mapped_column(String(128))
    model: Mapped[str | None] = mapped_column(String(256))
    protocol: Mapped[str | None] = mapped_column(String(40))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    metadata_: Mapped[dict[str, str] | None] = mapped_column("metadata", JSON)
    first_received_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    #: The latest arrival among the call's events as of its last reconciliation, or of the
    #: events that made it pending (the later events of a pending call do not update it: the
    #: reconciler takes the last arrival from the events' ``received_at``). The due-call indexes
    #: order by it: pending calls in the order they started waiting, open ones by quiet time.
    last_received_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    change_seq: Mapped[int] = mapped_column(BigInteger, nullable=False, default=1)
    pending: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True)
    status: Mapped[str] = mapped_column(String(32), nullable=False, default="open")
    settled: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    settled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    usage_source: Mapped[str | None] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    # The token columns (``TokenColumns``), then:
    cost_pusd: Mapped[int | None] = mapped_column(BigInteger, sort_order=AFTER_TOKENS)
    error_type: Mapped[str | None] = mapped_column(String(64), sort_order=AFTER_TOKENS)
    stop_reason: Mapped[str | None] = mapped_column(String(64), sort_order=AFTER_TOKENS)
    anomalies: Mapped[list[str]] = mapped_column(
        JSON, nullable=False, default=list, sort_order=AFTER_TOKENS
    )
    #: The stream.started's provider (defaulted from the protocol) and upstream account, written
    #: by ingest (CONTRACT "Provider reports and drift"); the drift compares by them.
    provider: Mapped[str | None] = mapped_column(String(64), sort_order=AFTER_TOKENS + 1)
    upstream_account: Mapped[str | None] = mapped_column(String(128), sort_order=AFTER_TOKENS + 1)
    #: (v2) The served tier (the last attempt's that reported one), units (name → count, summed
    #: over attempts) and other models (``[{"model", …token fields}]``, summed per model) of the
    #: call, CONTRACT "Usage dimensions (v2)"; null for none.
    service_tier: Mapped[str | None] = mapped_column(String(32), sort_order=AFTER_TOKENS + 1)
    units: Mapped[dict[str, int] | None] = mapped_column(JSON, sort_order=AFTER_TOKENS + 1)
    other_models: Mapped[list[dict[str, Any]] | None] = mapped_column(
        JSON, sort_order=AFTER_TOKENS + 1
    )
    #: (v2) The customer and plan of the call's key in force at its start (``key_assignments``)
    #: and what the customer is charged, in picodollars (null: no cost and no plan price),
    #: CONTRACT "Keys, customers and plans (v2)".
    customer_id: Mapped[str | None] = mapped_column(String(128), sort_order=AFTER_TOKENS + 2)
    plan_id: Mapped[str | None] = mapped_column(String(128), sort_order=AFTER_TOKENS + 2)
    charge_pusd: Mapped[int | None] = mapped_column(BigInteger, sort_order=AFTER_TOKENS + 2)

    __table_args__ = (
        Index(None, "call_no", unique=True),
        # (v2) The call log's customer filter (billing.calllog.queries). Partial (0012): every
        # query of it names a customer, and a call without one (settled by the reconciler's
        # fast path) then writes no entry to it.
        Index(
            None,
            "customer_id",
            "started_at",
            "request_id",
            postgresql_where=text("customer_id IS NOT NULL"),
            sqlite_where=text("customer_id IS NOT NULL"),
        ),
        Index(None, "api_key_id", "started_at", "request_id"),
        Index(None, "model", "started_at", "request_id"),
        Index(None, "started_at", "request_id"),
        # The reconciler's two due queries, each read in order as one range
        # (billing.reconcile.service.due_calls). Partial: only the calls each query can return,
        # so settling a call (pending and settled change on every step) adds no entry to them
        # (PostgreSQL cannot update calls in place: the changed columns are indexed). The
        # predicates are written as the queries state them (SQLite matches them term by term).
        Index(
            None,
            "pending",
            "last_received_at",
            "request_id",
            postgresql_where=text("pending"),
            sqlite_where=text("pending = 1"),
        ),
        Index(
            None,
            "settled",
            "pending",
            "last_received_at",
            "request_id",
            postgresql_where=text("NOT settled AND NOT pending"),
            sqlite_where=text("settled = 0 AND pending = 0"),
        ),
        # The call log's status filter, alone and with a key (billing.calllog.queries).
        Index(None, "status", "started_at", "request_id"),
        Index(None, "api_key_id", "status", "started_at", "request_id"),
        # (v2) The calls with units, by start, alone and after a key or a model
        # (billing.calllog.usage sums their units). Partial, so a key's or a model's calls
        # without units are not read: without them SQLite takes the full key or model index and
        # checks every call of the period for units.
        *(
            Index(
                None,
                *columns,
                postgresql_where=text("units IS NOT NULL"),
                sqlite_where=text("units IS NOT NULL"),
            )
            for columns in (("started_at",), ("api_key_id", "started_at"), ("model", "started_at"))
        ),
        # (v2, 0010) ... and after a customer (a name of its own: the plain index of these
        # columns has the default one)
        Index(
            "ix_calls_units_customer_id_started_at",
            "customer_id",
            "started_at",
            postgresql_where=text("units IS NOT NULL"),
            sqlite_where=text("units IS NOT NULL"),
        ),
    )


class CallAttempt(TokenColumns, Base):
    """Figures of one upstream attempt of a call with more than one attempt, as last reconciled
    (CONTRACT "Reconciliation"). A call with one attempt has no row here: it is its attempt,
    and its ``calls`` row holds the same figures, model, status, usage source, error type and
    stop reason."""

    __tablename__ = "call_attempts"

    request_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("calls.request_id"), primary_key=True
    )
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str | None] = mapped_column(String(256))
    status: Mapped[str] = mapped_column(String(32), nullable=False)
    usage_source: Mapped[str] = mapped_column(String(16), nullable=False)
    # The token columns (``TokenColumns``), then:
    error_type: Mapped[str | None] = mapped_column(String(64), sort_order=AFTER_TOKENS)
    stop_reason: Mapped[str | None] = mapped_column(String(64), sort_order=AFTER_TOKENS)


class Price(PriceRates, Base):
    """A model's price from ``effective_from`` on, in micro-USD per million tokens.

    Micro-USD per million tokens is numerically picodollars per token, so ``tokens × price`` is an
    exact cost in picodollars (CONTRACT "Cost": at most 6 decimal places).
    """

    __tablename__ = "prices"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(256), nullable=False)
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    # The rate columns (``PriceRates``), then:
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, sort_order=1)
    #: (v2) The served tier the price applies to; '' for none (every tier without its own price).
    service_tier: Mapped[str] = mapped_column(
        String(32), nullable=False, server_default=text("''"), sort_order=2
    )
    #: (v2) 0 for a price; more for its long-context prices (an attempt whose input, cache read
    #: and cache creation tokens exceed it), stored as a second row of the same identity.
    above_input_tokens: Mapped[int] = _counter(sort_order=2)
    #: (v2) Unit name → micro-USD per unit, as sorted compact JSON text; null for none.
    unit_prices: Mapped[str | None] = mapped_column(Text, sort_order=2)

    __table_args__ = (
        UniqueConstraint("model", "service_tier", "effective_from", "above_input_tokens"),
    )


class LedgerEntry(TokenColumns, EntryRates, EntryPlanRates, Base):
    """An immutable ledger entry: a ``settlement`` or an ``adjustment`` (CONTRACT "Reconciliation").

    Never updated or deleted. ``(request_id, seq)`` is unique, so a second reconciler writing the
    same step of the same call fails instead of booking twice. Token fields are signed deltas;
    prices are those used for this entry (null when unpriced), and ``cost_pusd`` (picodollars)
    always equals the tokens of this row times its own prices.
    """

    __tablename__ = "ledger_entries"

    entry_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(128), nullable=False)
    seq: Mapped[int] = mapped_column(Integer, nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    reason: Mapped[str] = mapped_column(String(200), nullable=False)
    booked_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    api_key_id: Mapped[str | None] = mapped_column(String(128))
    model: Mapped[str | None] = mapped_column(String(256))
    protocol: Mapped[str | None] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(32), nullable=False)
    call_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The token columns (``TokenColumns``), then:
    price_id: Mapped[int | None] = mapped_column(BigInteger, sort_order=AFTER_TOKENS)
    # The rates used (``EntryRates``), then:
    cost_pusd: Mapped[int | None] = mapped_column(BigInteger, sort_order=AFTER_TOKENS + 2)
    #: (v2) The units of the line (name → signed count) and the unit prices used (name →
    #: micro-USD per unit), each as sorted compact JSON text (the v2 CSV cell); null for none.
    units: Mapped[str | None] = mapped_column(Text, sort_order=AFTER_TOKENS + 3)
    unit_prices: Mapped[str | None] = mapped_column(Text, sort_order=AFTER_TOKENS + 3)
    #: (v2) The customer and plan the line is charged to, the plan's price used (its id, its
    #: rates: ``EntryPlanRates``, its unit prices as sorted compact JSON text of micro-USD per
    #: unit) or else the plan's markup (``markup_pct``, a plain decimal text; null without a
    #: plan, or with a plan price), and the charge in picodollars: ``charge_pusd`` always equals
    #: this row's tokens and units at its plan prices, else its ``cost_pusd`` × (1 +
    #: ``markup_pct`` / 100), else its ``cost_pusd`` (CONTRACT "Keys, customers and plans (v2)").
    customer_id: Mapped[str | None] = mapped_column(String(128), sort_order=AFTER_TOKENS + 4)
    plan_id: Mapped[str | None] = mapped_column(String(128), sort_order=AFTER_TOKENS + 4)
    plan_price_id: Mapped[int | None] = mapped_column(BigInteger, sort_order=AFTER_TOKENS + 4)
    # The plan's rates (``EntryPlanRates``), then:
    plan_unit_prices: Mapped[str | None] = mapped_column(Text, sort_order=AFTER_TOKENS + 6)
    markup_pct: Mapped[str | None] = mapped_column(String(32), sort_order=AFTER_TOKENS + 6)
    charge_pusd: Mapped[int | None] = mapped_column(BigInteger, sort_order=AFTER_TOKENS + 6)

    __table_args__ = (
        UniqueConstraint("request_id", "seq"),
        Index(None, "booked_at", "entry_id"),
        # (v2) A customer's entries by booking (billing.calllog.usage's ragged edges). Partial
        # (0012), as the calls' customer index.
        Index(
            None,
            "customer_id",
            "booked_at",
            postgresql_where=text("customer_id IS NOT NULL"),
            sqlite_where=text("customer_id IS NOT NULL"),
        ),
        # (v2) A budget's settled spend when it is created: its key's entries by call start.
        Index(None, "api_key_id", "call_started_at"),
        # (v2) The entries with units, by booking, alone and after a key
        # (billing.calllog.usage sums their units).
        *(
            Index(
                None,
                *columns,
                postgresql_where=text("units IS NOT NULL"),
                sqlite_where=text("units IS NOT NULL"),
            )
            for columns in (("booked_at",), ("api_key_id", "booked_at"))
        ),
        # (v2, 0010) ... and after a customer
        Index(
            "ix_ledger_entries_units_customer_id_booked_at",
            "customer_id",
            "booked_at",
            postgresql_where=text("units IS NOT NULL"),
            sqlite_where=text("units IS NOT NULL"),
        ),
    )


class KeyAssignment(Base):
    """(v2) One version of an api key's customer, plan and name, from ``effective_from`` on
    (CONTRACT "Keys, customers and plans (v2)"). Rows are only ever added: the version in force
    at a time is the one with the latest ``effective_from`` at or before it; a key without one
    has no customer and no plan. ``(api_key_id, effective_from)`` is unique."""

    __tablename__ = "key_assignments"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    api_key_id: Mapped[str] = mapped_column(String(128), nullable=False)
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    customer_id: Mapped[str | None] = mapped_column(String(128))
    plan_id: Mapped[str | None] = mapped_column(String(128))
    name: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)

    __table_args__ = (
        UniqueConstraint("api_key_id", "effective_from"),
        Index(None, "plan_id"),
        Index(None, "customer_id"),
    )


class PlanVersion(Base):
    """(v2) One version of a plan from ``effective_from`` on: its markup over cost, in percent
    as a plain decimal text with at most ``billing.plans.schemas.MARKUP_DECIMALS`` places
    (``"20"``, ``"12.5"``), and its own prices (``PlanPrice``). ``(plan_id, effective_from)``
    is unique (CONTRACT "Keys, customers and plans (v2)")."""

    __tablename__ = "plan_versions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    plan_id: Mapped[str] = mapped_column(String(128), nullable=False)
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    markup_pct: Mapped[str] = mapped_column(String(32), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)

    __table_args__ = (UniqueConstraint("plan_id", "effective_from"),)


class PlanPrice(PriceRates, Base):
    """(v2) A plan version's own price for a model (and served tier): the shape of ``Price``
    (rates in micro-USD per million tokens, ``above_input_tokens`` > 0 for its long-context
    prices, unit prices as sorted compact JSON text of micro-USD per unit), in force from its
    version's ``effective_from``."""

    __tablename__ = "plan_prices"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    plan_version_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("plan_versions.id"), nullable=False
    )
    model: Mapped[str] = mapped_column(String(256), nullable=False)
    service_tier: Mapped[str] = mapped_column(String(32), nullable=False, sort_order=2)
    above_input_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, sort_order=2)
    unit_prices: Mapped[str | None] = mapped_column(Text, sort_order=2)

    __table_args__ = (
        UniqueConstraint(
            "plan_version_id",
            "model",
            "service_tier",
            "above_input_tokens",
            name="uq_plan_prices_identity",
        ),
    )


class ApiToken(Base):
    """An API token (CONTRACT "Who may do what"): one role, stored only as a SHA-256 hash."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    token_hash: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: The token stops working at this time (None: never).
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: When the token was last presented, to the minute (``billing.auth.guard.TokenCache``).
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class _RollupTotals(TokenColumns):
    """The summed columns shared by both rollup tables (see ``UsageRollup``): the counts, the
    token columns, then the cost and the unpriced count."""

    members: Mapped[int] = _counter()
    calls: Mapped[int] = _counter()
    cost_whole_usd: Mapped[int] = _counter(sort_order=AFTER_TOKENS)
    cost_frac_pusd: Mapped[int] = _counter(sort_order=AFTER_TOKENS)
    unpriced: Mapped[int] = _counter(sort_order=AFTER_TOKENS)
    #: (v2) The charge, split as the cost is, and the contributions without a charge (CONTRACT
    #: "Keys, customers and plans (v2)").
    charge_whole_usd: Mapped[int] = _counter(sort_order=AFTER_TOKENS + 1)
    charge_frac_pusd: Mapped[int] = _counter(sort_order=AFTER_TOKENS + 1)
    uncharged: Mapped[int] = _counter(sort_order=AFTER_TOKENS + 1)


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
    calls: Mapped[int] = _counter()
    requests: Mapped[int] = _counter()
    input_tokens: Mapped[int] = _counter()
    cache_read_input_tokens: Mapped[int] = _counter()
    cache_creation_input_tokens: Mapped[int] = _counter()
    output_tokens: Mapped[int] = _counter()
    cost_whole_usd: Mapped[int] = _counter()
    cost_frac_pusd: Mapped[int] = _counter()
    unpriced_calls: Mapped[int] = _counter()


def row_dict(obj: Any) -> dict[str, Any]:
    """A mapped object's column values by attribute name (for tests and serialisers)."""
    return {c.key: getattr(obj, c.key) for c in obj.__mapper__.column_attrs}


class ProviderReportVersion(Base):
    """One version of one provider report bucket (CONTRACT "Provider reports and drift").

    A bucket is (provider, kind, bucket_start, bucket_end), in UTC as the provider gives it;
    ``version`` counts from 1, and the highest is current. Rows are only ever added: a
    re-import with other figures adds version n + 1 (``content_hash``: SHA-256 of the bucket's
    lines), the same figures add nothing. ``(provider, kind, bucket_start, bucket_end,
    version)`` is unique, so concurrent imports of one page store it once
    (``billing.providers.service``).
    """

    __tablename__ = "provider_report_versions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    provider: Mapped[str] = mapped_column(String(32), nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    bucket_end: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    content_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    imported_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)

    __table_args__ = (
        UniqueConstraint(
            "provider",
            "kind",
            "bucket_start",
            "bucket_end",
            "version",
            name="uq_provider_report_versions_bucket_version",
        ),
        Index(None, "bucket_start", "provider", "kind"),
    )


class ProviderReportLine(Base):
    """One result of a provider report bucket version, in the contract's token semantics.

    Token counts are integers (null where the report has no such figure: a cost line has no
    tokens, Anthropic's usage report no request count); ``cost_usd`` is the exact decimal text
    in USD (OpenAI's dollars read from the JSON text, Anthropic's cents divided by 100): provider
    amounts carry more decimals than any integer unit would hold, and a report holds few lines,
    summed as ``Decimal``. ``result`` is the provider's result object as received.
    """

    __tablename__ = "provider_report_lines"

    version_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("provider_report_versions.id"), primary_key=True
    )
    line_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str | None] = mapped_column(String(256))
    upstream_account: Mapped[str | None] = mapped_column(String(128))
    service_tier: Mapped[str | None] = mapped_column(String(32))
    requests: Mapped[int | None] = mapped_column(BigInteger)
    input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cache_read_input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cache_creation_input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    output_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cost_usd: Mapped[str | None] = mapped_column(String(64))
    result: Mapped[str] = mapped_column(Text, nullable=False)


class Budget(Base):
    """One version of a budget (CONTRACT "Budgets and alerts (v2)", ``billing.budgets``).

    ``budget_id`` is the public id; ``version`` counts from 1, and the version whose
    ``ended_at`` is null is the one in force (``PUT`` ends it and adds the next, ``DELETE`` ends
    it): rows are never deleted, so a budget's history stays. The scope is ``api_key_id`` or
    ``customer_id`` (exactly one is set). ``limit_usd`` and ``thresholds`` (a JSON list of
    fractions of the limit, ascending) are exact decimal texts. ``tracked_from`` is the start
    of the first period this version counts (the one it was created in: its counter was filled
    from the ledger then); spend of earlier periods is not kept for it. ``webhook_secret`` is the
    ``whsec_…`` secret webhooks are signed with (the same for every version of a budget).
    """

    __tablename__ = "budgets"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    budget_id: Mapped[str] = mapped_column(String(128), nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    api_key_id: Mapped[str | None] = mapped_column(String(128))
    customer_id: Mapped[str | None] = mapped_column(String(128))
    measure: Mapped[str] = mapped_column(String(16), nullable=False)
    period: Mapped[str] = mapped_column(String(8), nullable=False)
    tz: Mapped[str] = mapped_column(String(64), nullable=False)
    limit_usd: Mapped[str] = mapped_column(String(64), nullable=False)
    thresholds: Mapped[str] = mapped_column(Text, nullable=False)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    webhook_secret: Mapped[str] = mapped_column(String(80), nullable=False)
    tracked_from: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        UniqueConstraint("budget_id", "version"),
        # The budgets in force over a key or a customer (the spend check, the counters).
        Index(
            "ix_budgets_live_api_key_id",
            "api_key_id",
            postgresql_where=text("ended_at IS NULL"),
            sqlite_where=text("ended_at IS NULL"),
        ),
        Index(
            "ix_budgets_live_customer_id",
            "customer_id",
            postgresql_where=text("ended_at IS NULL"),
            sqlite_where=text("ended_at IS NULL"),
        ),
    )


class BudgetGeneration(Base):
    """One row (``id`` 1): a number that every write of ``budgets`` (a version added or ended)
    bumps in its transaction, so that a process's copy of the budgets in force
    (``billing.budgets.cache``) knows it is stale, whichever process or replica wrote. A missing
    row (tables emptied) reads as None and the next write puts it back."""

    __tablename__ = "budget_generation"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    generation: Mapped[int] = mapped_column(BigInteger, nullable=False)


class BudgetSpend(Base):
    """A budget version's spend in one period (``period_start``, UTC), in picodollars of its
    measure: ``settled_pusd`` (ledger amounts of the calls started in the period) and
    ``provisional_pusd`` (the current figures of its open calls). Kept incrementally by the
    reconciler's steps (``billing.budgets.counters``); never reset: a new period is a new row."""

    __tablename__ = "budget_spend"

    budget_row: Mapped[int] = mapped_column(BigInteger, ForeignKey("budgets.id"), primary_key=True)
    period_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    settled_pusd: Mapped[int] = _counter()
    provisional_pusd: Mapped[int] = _counter()


class BudgetOpenCall(Base):
    """What an open call adds to the budgets' provisional spend now (its key, customer, start
    and current amounts per measure, picodollars), so that a step takes exactly that back when
    the call's figures change or it settles (``billing.budgets.counters``)."""

    __tablename__ = "budget_open_calls"

    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    api_key_id: Mapped[str] = mapped_column(String(128), nullable=False)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    cost_pusd: Mapped[int] = _counter()
    charge_pusd: Mapped[int] = _counter()
    # (0009) the call's customer at its start, as the step wrote it: a customer budget's share
    customer_id: Mapped[str | None] = mapped_column(String(128))

    __table_args__ = (
        Index(None, "api_key_id", "started_at"),
        Index(None, "customer_id", "started_at"),
    )


class BudgetAlert(Base):
    """An alert (CONTRACT "Budgets and alerts (v2)"): ``budget.threshold_crossed`` or
    ``budget.threshold_resolved`` of a budget, period and threshold, at most once each
    (unique). ``body`` is the webhook's JSON body, fixed when the alert is made (every retry
    sends the same bytes)."""

    __tablename__ = "budget_alerts"

    alert_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    budget_id: Mapped[str] = mapped_column(String(128), nullable=False)
    budget_row: Mapped[int] = mapped_column(BigInteger, ForeignKey("budgets.id"), nullable=False)
    period_start: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    threshold: Mapped[str] = mapped_column(String(40), nullable=False)
    type: Mapped[str] = mapped_column(String(40), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    body: Mapped[str] = mapped_column(Text, nullable=False)

    __table_args__ = (
        UniqueConstraint("budget_id", "period_start", "threshold", "type"),
        Index(None, "budget_id", "created_at"),
        Index(None, "created_at"),
    )


class WebhookOutbox(Base):
    """The webhook of an alert to deliver (written in the alert's transaction): ``state``
    ``pending`` → ``delivered``, or ``failed`` once ``BILLING_WEBHOOK_RETRY_S`` have passed
    since ``created_at``. A worker claims a due row by setting ``lease_owner`` /
    ``lease_until`` (``billing.budgets.webhooks``)."""

    __tablename__ = "webhook_outbox"

    alert_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("budget_alerts.alert_id"), primary_key=True
    )
    url: Mapped[str] = mapped_column(Text, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    lease_owner: Mapped[str | None] = mapped_column(String(40))
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String(200))
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index(
            "ix_webhook_outbox_due",
            "next_attempt_at",
            postgresql_where=text("state = 'pending'"),
            sqlite_where=text("state = 'pending'"),
        ),
    )
