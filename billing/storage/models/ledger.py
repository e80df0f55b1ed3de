"""Prices and the ledger (CONTRACT "Cost", "Reconciliation")."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from billing.storage.models.base import (
    AFTER_TOKENS,
    Base,
    BigId,
    EntryPlanRates,
    EntryRates,
    PriceRates,
    TokenColumns,
    counter,
)
from billing.storage.types import UTCDateTime


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
    above_input_tokens: Mapped[int] = counter(sort_order=2)
    #: (v2) Unit name → micro-USD per unit, as sorted compact JSON text; null for none.
    unit_prices: Mapped[str | None] = mapped_column(Text, sort_order=2)
    #: (v3) The inference geo the price applies to; '' for none (every geo without its own
    #: price), CONTRACT "Non-streaming calls, hosted-tool fees, provider-reported cost (v3)".
    inference_geo: Mapped[str] = mapped_column(
        String(32), nullable=False, server_default=text("''"), sort_order=3
    )

    __table_args__ = (
        UniqueConstraint(
            "model",
            "service_tier",
            "inference_geo",
            "effective_from",
            "above_input_tokens",
            name="uq_prices_identity",
        ),
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
    #: (v3) The cost the provider reported itself for the line, in picodollars (null: not
    #: reported; beside ``cost_pusd``, never billed); the plan's charge policy for a failed
    #: call the line was charged under (``bill_delivered`` or ``void``; null: ``bill``) and the
    #: cost it left uncharged (``leakage_pusd``: 0 for none, null when the cost is not known):
    #: ``charge_pusd`` is then this row's tokens and units charged as the policy says
    #: (``billing.plans.charges.policy_charge``), CONTRACT "Charge policy for failed calls (v3)".
    provider_cost_pusd: Mapped[int | None] = mapped_column(BigInteger, sort_order=AFTER_TOKENS + 7)
    failure_charge: Mapped[str | None] = mapped_column(String(16), sort_order=AFTER_TOKENS + 7)
    leakage_pusd: Mapped[int | None] = mapped_column(BigInteger, sort_order=AFTER_TOKENS + 7)

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
