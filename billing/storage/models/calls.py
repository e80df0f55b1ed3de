"""The events and the calls they make (CONTRACT "Events", "Reconciliation")."""

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
    String,
    Text,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from billing.storage.models.base import (
    AFTER_TOKENS,
    Base,
    BigId,
    TokenColumns,
)
from billing.storage.types import UTCDateTime


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
    #: (v3) What the provider counts but does not bill per use (name → count, summed over
    #: attempts; null for none), the cost it reported itself in picodollars (null: not
    #: reported), the place it says it served the call (CONTRACT "Non-streaming calls, hosted-tool
    #: fees, provider-reported cost (v3)"), and the cost that the plan's charge policy for failed
    #: calls left uncharged, in picodollars (0: none; null: the cost is not known), CONTRACT
    #: "Charge policy for failed calls (v3)".
    counters: Mapped[dict[str, int] | None] = mapped_column(JSON, sort_order=AFTER_TOKENS + 3)
    provider_cost_pusd: Mapped[int | None] = mapped_column(BigInteger, sort_order=AFTER_TOKENS + 3)
    inference_geo: Mapped[str | None] = mapped_column(String(32), sort_order=AFTER_TOKENS + 3)
    leakage_pusd: Mapped[int | None] = mapped_column(BigInteger, sort_order=AFTER_TOKENS + 3)

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
        # (0013, v3) The calls no reconciliation step has read yet (ingest writes 0 attempts, a
        # step the call's count), by key: the budgets count them from their ingest
        # (billing.budgets.spent). Partial: a step takes the call out of it.
        Index(
            "ix_calls_unstepped",
            "api_key_id",
            "started_at",
            postgresql_where=text("attempts = 0"),
            sqlite_where=text("attempts = 0"),
        ),
        # (0019, v3) The open calls by owner: a credit balance's pending charges
        # (billing.credits.sql.common, ``pending``: a customer's, or a key's without one).
        # Partial: settling a call takes it out. The predicate as the query writes it.
        Index(
            "ix_calls_open_owner",
            "customer_id",
            "api_key_id",
            postgresql_where=text("settled IS false"),
            sqlite_where=text("settled IS 0"),
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
