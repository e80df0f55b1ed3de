"""Budgets, their counters, alerts and the webhooks' outbox (CONTRACT "Budgets and alerts (v2)")."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from billing.storage.models.base import (
    Base,
    BigId,
    counter,
)
from billing.storage.types import UTCDateTime


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
    # (0013, v3) a tag scope (neither a key, a customer nor a tag: every call), a model or a
    # model prefix ending in ``*``, a rolling window's seconds (``period`` "rolling") and what
    # an authorization of an unpriced model gets ("allow" | "deny"; null: "allow").
    tag: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(256))
    window_s: Mapped[int | None] = mapped_column(Integer)
    unpriced: Mapped[str | None] = mapped_column(String(8))

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
    settled_pusd: Mapped[int] = counter()
    provisional_pusd: Mapped[int] = counter()


class BudgetOpenCall(Base):
    """What an open call adds to the budgets' provisional spend now (its key, customer, start
    and current amounts per measure, picodollars), so that a step takes exactly that back when
    the call's figures change or it settles (``billing.budgets.counters``)."""

    __tablename__ = "budget_open_calls"

    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    api_key_id: Mapped[str] = mapped_column(String(128), nullable=False)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    cost_pusd: Mapped[int] = counter()
    charge_pusd: Mapped[int] = counter()
    # (0009) the call's customer at its start, as the step wrote it: a customer budget's share
    customer_id: Mapped[str | None] = mapped_column(String(128))

    __table_args__ = (
        Index(None, "api_key_id", "started_at"),
        Index(None, "customer_id", "started_at"),
    )


#: A hold neither released nor settled (``BudgetHold``'s live indexes).
_LIVE = "released_at IS NULL AND settled_at IS NULL"


class BudgetHold(Base):
    """A granted authorization (CONTRACT "Authorizations and holds (v3)"): ``hold_pusd``
    reserved for the call ``request_id`` of ``api_key_id`` (its customer at the authorization,
    its ``tags`` as a JSON list, its ``model``) until ``expires_at``, ``released_at`` (DELETE)
    or the call's first event (a ``calls`` row with this ``request_id``: the call's own figure
    replaces it; ``settled_at`` once the call settled). ``body_hash`` is the SHA-256 of the
    authorization's canonical body and ``answer`` its first answer (JSON), returned again to a
    repeated authorization."""

    __tablename__ = "budget_holds"

    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    api_key_id: Mapped[str] = mapped_column(String(128), nullable=False)
    customer_id: Mapped[str | None] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(256), nullable=False)
    tags: Mapped[str] = mapped_column(Text, nullable=False)
    hold_pusd: Mapped[int] = mapped_column(BigInteger, nullable=False)
    body_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    answer: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: When the reconciliation step that settled its call ran: from then on the hold counts
    #: nothing (a call never stops being settled) and is no longer among the live ones.
    settled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        # The holds neither released nor settled, by expiry: every live one, a key's, a
        # customer's.
        Index(
            "ix_budget_holds_live",
            "expires_at",
            postgresql_where=text(_LIVE),
            sqlite_where=text(_LIVE),
        ),
        Index(
            "ix_budget_holds_live_api_key_id",
            "api_key_id",
            "expires_at",
            postgresql_where=text(_LIVE),
            sqlite_where=text(_LIVE),
        ),
        Index(
            "ix_budget_holds_live_customer_id",
            "customer_id",
            "expires_at",
            postgresql_where=text(_LIVE + " AND customer_id IS NOT NULL"),
            sqlite_where=text(_LIVE + " AND customer_id IS NOT NULL"),
        ),
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
