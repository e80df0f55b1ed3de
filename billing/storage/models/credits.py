"""Customers as a resource, prepaid credit grants and the credit entries that draw them
(CONTRACT "Prepaid credits (v3)")."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from billing.storage.models.base import Base, BigId, counter
from billing.storage.types import UTCDateTime


class Customer(Base):
    """(v3) A customer's settings: its name, whether it must hold credit to be admitted
    (``credit_required``) and the available balance under which ``credits.low`` is sent
    (``low_balance_pusd``, null for none). A customer named only by keys has no row and the
    defaults. ``PUT /v1/customers/{id}`` writes the row (settings, not booked figures)."""

    __tablename__ = "customers"

    customer_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(256))
    credit_required: Mapped[bool] = mapped_column(Boolean, nullable=False)
    low_balance_pusd: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class CreditGrant(Base):
    """(v3) A grant of prepaid credit to one owner: a customer (``customer_id``) or a key
    without a customer (``api_key_id``), exactly one set. What is drawn, expired or voided of it
    are ``CreditEntry`` rows; its ``grant`` entry books ``amount_pusd``. The grant as posted is
    never updated; ``remaining_pusd`` is the sum of its entries (its grant less its draws,
    reversals, expiries and voids), kept by the transaction that books each of them
    (``billing.credits.sql.common.CoreCredits.add``), so that a balance reads one row a grant
    instead of every draw (migration 0020)."""

    __tablename__ = "credit_grants"

    grant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    customer_id: Mapped[str | None] = mapped_column(String(128))
    api_key_id: Mapped[str | None] = mapped_column(String(128))
    amount_pusd: Mapped[int] = mapped_column(BigInteger, nullable=False)
    effective_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    priority: Mapped[int] = mapped_column(Integer, nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    note: Mapped[str | None] = mapped_column(String(1000))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    remaining_pusd: Mapped[int] = counter()

    __table_args__ = (
        Index(None, "customer_id"),
        Index(None, "api_key_id"),
        Index(None, "expires_at"),
    )


class CreditOverdraft(Base):
    """(v3) An owner's overdraft: the sum of its ``CreditEntry`` rows of no grant (overdrafts
    less their reversals), kept like ``CreditGrant.remaining_pusd`` by the transaction that books
    each of them; a row from the owner's first such entry. ``owner`` is ``customer:<id>`` or
    ``key:<id>`` (``billing.credits.rows.Owner.account``). The sum is exact picodollars split
    as ``overdraft_whole_usd * 10**12 + overdraft_pusd`` (0 <= ``overdraft_pusd`` < 10**12,
    migration 0027), so that an owner's overdrafts past 2**63 picodollars (9.2 million USD)
    neither overflow a 64-bit integer (PostgreSQL refused the step: its call never settled)
    nor turn it to a binary float (SQLite's integer arithmetic does on overflow)."""

    __tablename__ = "credit_overdrafts"

    owner: Mapped[str] = mapped_column(String(140), primary_key=True)
    customer_id: Mapped[str | None] = mapped_column(String(128))
    api_key_id: Mapped[str | None] = mapped_column(String(128))
    #: The part of the overdraft below a dollar, in picodollars (0 to 10**12 - 1).
    overdraft_pusd: Mapped[int] = mapped_column(BigInteger, nullable=False)
    #: (0027) The whole dollars of the overdraft.
    overdraft_whole_usd: Mapped[int] = mapped_column(
        BigInteger, nullable=False, server_default=text("0")
    )


class CreditEntry(Base):
    """(v3) One booked movement of credit, never updated or deleted. ``kind``: ``grant``
    (+ the grant's amount), ``draw`` (a charge drawn from a grant), ``expiry`` and ``void``
    (what was left of a grant at its ``expires_at`` / when voided), ``overdraft`` (the part of
    a charge no grant covered: ``grant_id`` null), ``reversal`` (a draw's or an overdraft's
    amount taken back, negative, when the call's charge was adjusted). ``amount_pusd`` is in
    the kind's own direction, so a grant's remainder is its grant − its draws and reversals −
    its expiries and voids. A draw, overdraft or reversal names the call's ledger entry
    (``request_id``, ``ledger_seq``) and carries the call's number (``calls.call_no``), by which
    a redraw finds them. ``dedupe_key`` (unique where set) books a grant's expiry or
    void once under concurrency."""

    __tablename__ = "credit_entries"

    entry_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    booked_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    customer_id: Mapped[str | None] = mapped_column(String(128))
    api_key_id: Mapped[str | None] = mapped_column(String(128))
    grant_id: Mapped[str | None] = mapped_column(String(128))
    amount_pusd: Mapped[int] = mapped_column(BigInteger, nullable=False)
    request_id: Mapped[str | None] = mapped_column(String(128))
    ledger_seq: Mapped[int | None] = mapped_column(Integer)
    dedupe_key: Mapped[str | None] = mapped_column(Text)
    call_no: Mapped[int | None] = mapped_column(BigInteger)

    # Each index is read: by dedupe key (a grant's expiry or void), by booking time (the
    # credits export), by call number (a redraw reads what the call drew: numbers are given in
    # arrival order, so a step's draws land at the index's end, where its ``request_id`` put
    # each anywhere: 1.6 µs a draw on SQLite, 0026), by owner in booking order
    # (its latest entries: the index's last rows rather than a sort of all of them), a
    # customer's and a key's own apart, so that each entry still pays one owner index. None by
    # grant (0022): a grant's remainder is kept on its row, and every draw would pay for it.
    __table_args__ = (
        # Unique where set (0023): only an expiry or a void has a key; the draws, booked by the
        # thousand, would each pay for an index entry of their null.
        Index(
            "uq_credit_entries_dedupe_key",
            "dedupe_key",
            unique=True,
            postgresql_where=text("dedupe_key IS NOT NULL"),
            sqlite_where=text("dedupe_key IS NOT NULL"),
        ),
        Index(None, "booked_at", "entry_id"),
        Index(None, "call_no"),
        Index(
            "ix_credit_entries_customer_booked",
            "customer_id",
            "booked_at",
            "entry_id",
            postgresql_where=text("customer_id IS NOT NULL"),
            sqlite_where=text("customer_id IS NOT NULL"),
        ),
        Index(
            "ix_credit_entries_key_booked",
            "api_key_id",
            "booked_at",
            "entry_id",
            postgresql_where=text("customer_id IS NULL"),
            sqlite_where=text("customer_id IS NULL"),
        ),
    )
