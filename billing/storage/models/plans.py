"""Keys' assignments and plans (CONTRACT "Keys, customers and plans (v2)")."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from billing.storage.models.base import (
    Base,
    BigId,
    PriceRates,
)
from billing.storage.types import UTCDateTime


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
    #: (v3) The charge policy for failed calls: compact JSON text of the categories that are
    #: not ``bill`` (``{"upstream_error":"void"}``); null when every one is ``bill``, CONTRACT
    #: "Charge policy for failed calls (v3)".
    failure_charges: Mapped[str | None] = mapped_column(Text)

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
    #: (v3) The inference geo the price applies to; '' for none.
    inference_geo: Mapped[str] = mapped_column(
        String(32), nullable=False, server_default=text("''"), sort_order=3
    )

    __table_args__ = (
        UniqueConstraint(
            "plan_version_id",
            "model",
            "service_tier",
            "inference_geo",
            "above_input_tokens",
            name="uq_plan_prices_identity",
        ),
    )
