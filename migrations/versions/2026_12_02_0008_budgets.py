"""budgets and alerts (v2): budgets (versioned), budget_spend, budget_open_calls, budget_alerts,
webhook_outbox; ledger entries by key and call start (a budget's first counter)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 00:08:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: A UTC instant: ``timestamptz`` on PostgreSQL, naive UTC text on SQLite (the ORM's UTCDateTime).
UTC_DATETIME = sa.DateTime(timezone=True)
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _counter(name: str) -> sa.Column:
    return sa.Column(name, sa.BigInteger(), server_default=sa.text("0"), nullable=False)


def _live(name: str, column: str) -> None:
    op.create_index(
        name,
        "budgets",
        [column],
        postgresql_where=sa.text("ended_at IS NULL"),
        sqlite_where=sa.text("ended_at IS NULL"),
    )


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("budget_id", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("api_key_id", sa.String(length=128), nullable=True),
        sa.Column("customer_id", sa.String(length=128), nullable=True),
        sa.Column("measure", sa.String(length=16), nullable=False),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("tz", sa.String(length=64), nullable=False),
        sa.Column("limit_usd", sa.String(length=64), nullable=False),
        sa.Column("thresholds", sa.Text(), nullable=False),
        sa.Column("webhook_url", sa.Text(), nullable=True),
        sa.Column("webhook_secret", sa.String(length=80), nullable=False),
        sa.Column("tracked_from", UTC_DATETIME, nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("ended_at", UTC_DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_budgets"),
        sa.UniqueConstraint("budget_id", "version", name="uq_budgets_budget_id_version"),
    )
    _live("ix_budgets_live_api_key_id", "api_key_id")
    _live("ix_budgets_live_customer_id", "customer_id")
    op.create_table(
        "budget_spend",
        sa.Column("budget_row", sa.BigInteger(), nullable=False),
        sa.Column("period_start", UTC_DATETIME, nullable=False),
        _counter("settled_pusd"),
        _counter("provisional_pusd"),
        sa.ForeignKeyConstraint(
            ["budget_row"], ["budgets.id"], name="fk_budget_spend_budget_row_budgets"
        ),
        sa.PrimaryKeyConstraint("budget_row", "period_start", name="pk_budget_spend"),
    )
    op.create_table(
        "budget_open_calls",
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("api_key_id", sa.String(length=128), nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=False),
        _counter("cost_pusd"),
        _counter("charge_pusd"),
        sa.PrimaryKeyConstraint("request_id", name="pk_budget_open_calls"),
    )
    op.create_index(
        "ix_budget_open_calls_api_key_id_started_at",
        "budget_open_calls",
        ["api_key_id", "started_at"],
    )
    op.create_table(
        "budget_alerts",
        sa.Column("alert_id", sa.String(length=40), nullable=False),
        sa.Column("budget_id", sa.String(length=128), nullable=False),
        sa.Column("budget_row", sa.BigInteger(), nullable=False),
        sa.Column("period_start", UTC_DATETIME, nullable=False),
        sa.Column("threshold", sa.String(length=40), nullable=False),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["budget_row"], ["budgets.id"], name="fk_budget_alerts_budget_row_budgets"
        ),
        sa.PrimaryKeyConstraint("alert_id", name="pk_budget_alerts"),
        sa.UniqueConstraint(
            "budget_id",
            "period_start",
            "threshold",
            "type",
            name="uq_budget_alerts_budget_id_period_start_threshold_type",
        ),
    )
    op.create_index(
        "ix_budget_alerts_budget_id_created_at", "budget_alerts", ["budget_id", "created_at"]
    )
    op.create_index("ix_budget_alerts_created_at", "budget_alerts", ["created_at"])
    op.create_table(
        "webhook_outbox",
        sa.Column("alert_id", sa.String(length=40), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", UTC_DATETIME, nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("lease_owner", sa.String(length=40), nullable=True),
        sa.Column("lease_until", UTC_DATETIME, nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=200), nullable=True),
        sa.Column("delivered_at", UTC_DATETIME, nullable=True),
        sa.ForeignKeyConstraint(
            ["alert_id"],
            ["budget_alerts.alert_id"],
            name="fk_webhook_outbox_alert_id_budget_alerts",
        ),
        sa.PrimaryKeyConstraint("alert_id", name="pk_webhook_outbox"),
    )
    op.create_index(
        "ix_webhook_outbox_due",
        "webhook_outbox",
        ["next_attempt_at"],
        postgresql_where=sa.text("state = 'pending'"),
        sqlite_where=sa.text("state = 'pending'"),
    )
    # Plain CREATE INDEX (no batch rebuild of ledger_entries on SQLite).
    op.create_index(
        "ix_ledger_entries_api_key_id_call_started_at",
        "ledger_entries",
        ["api_key_id", "call_started_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_ledger_entries_api_key_id_call_started_at", "ledger_entries")
    op.drop_index("ix_webhook_outbox_due", "webhook_outbox")
    op.drop_table("webhook_outbox")
    op.drop_index("ix_budget_alerts_created_at", "budget_alerts")
    op.drop_index("ix_budget_alerts_budget_id_created_at", "budget_alerts")
    op.drop_table("budget_alerts")
    op.drop_index("ix_budget_open_calls_api_key_id_started_at", "budget_open_calls")
    op.drop_table("budget_open_calls")
    op.drop_table("budget_spend")
    op.drop_index("ix_budgets_live_customer_id", "budgets")
    op.drop_index("ix_budgets_live_api_key_id", "budgets")
    op.drop_table("budgets")
