"""initial schema: events, calls, attempts, prices, ledger, api tokens, usage rollups

Revision ID: 0001
Revises:
Create Date: 2026-12-01 00:01:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: A UTC instant: ``timestamptz`` on PostgreSQL, naive UTC text on SQLite (the ORM's UTCDateTime).
UTC_DATETIME = sa.DateTime(timezone=True)
#: An auto-numbered key: SQLite only makes an INTEGER PRIMARY KEY auto-increment.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
#: The token buckets of calls, attempts, ledger entries and rollups, as this revision has them.
TOKEN_COLUMNS = (
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens_billed",
    "output_tokens_delivered",
    "output_tokens_undelivered",
    "reasoning_tokens",
)


def _counter(name: str) -> sa.Column[int]:
    return sa.Column(name, sa.BigInteger(), server_default=sa.text("0"), nullable=False)


def _tokens() -> list[sa.Column[int]]:
    return [_counter(name) for name in TOKEN_COLUMNS]


def _rollup_totals() -> list[sa.Column[int]]:
    return [
        _counter("members"),
        _counter("calls"),
        *_tokens(),
        _counter("cost_whole_usd"),
        _counter("cost_frac_pusd"),
        _counter("unpriced"),
    ]


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("revoked_at", UTC_DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )

    op.create_table(
        "calls",
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("api_key_id", sa.String(length=128), nullable=True),
        sa.Column("model", sa.String(length=256), nullable=True),
        sa.Column("protocol", sa.String(length=40), nullable=True),
        sa.Column("started_at", UTC_DATETIME, nullable=True),
        sa.Column("ended_at", UTC_DATETIME, nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("first_received_at", UTC_DATETIME, nullable=False),
        sa.Column("last_received_at", UTC_DATETIME, nullable=False),
        sa.Column("change_seq", sa.BigInteger(), nullable=False),
        sa.Column("pending", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("settled", sa.Boolean(), nullable=False),
        sa.Column("settled_at", UTC_DATETIME, nullable=True),
        sa.Column("usage_source", sa.String(length=16), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        *_tokens(),
        sa.Column("cost_pusd", sa.BigInteger(), nullable=True),
        sa.Column("error_type", sa.String(length=64), nullable=True),
        sa.Column("stop_reason", sa.String(length=64), nullable=True),
        sa.Column("anomalies", sa.JSON(), nullable=False),
        sa.Column("call_no", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("request_id", name="pk_calls"),
    )
    # PostgreSQL numbers new calls from this sequence (``nextval('calls_call_no_seq')``); SQLite
    # has no sequences: there a new call gets one more than the largest, under the write lock.
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE SEQUENCE calls_call_no_seq AS bigint OWNED BY calls.call_no")
    op.create_index(
        "ix_calls_api_key_id_started_at_request_id",
        "calls",
        ["api_key_id", "started_at", "request_id"],
    )
    op.create_index(
        "ix_calls_model_started_at_request_id", "calls", ["model", "started_at", "request_id"]
    )
    op.create_index("ix_calls_started_at_request_id", "calls", ["started_at", "request_id"])
    op.create_index(
        "ix_calls_api_key_id_status_started_at_request_id",
        "calls",
        ["api_key_id", "status", "started_at", "request_id"],
    )
    op.create_index(
        "ix_calls_status_started_at_request_id", "calls", ["status", "started_at", "request_id"]
    )
    # The reconciler's two due queries; partial, so settling a call adds no entry to them.
    op.create_index(
        "ix_calls_pending_last_received_at_request_id",
        "calls",
        ["pending", "last_received_at", "request_id"],
        postgresql_where=sa.text("pending"),
        sqlite_where=sa.text("pending = 1"),
    )
    op.create_index(
        "ix_calls_settled_pending_last_received_at_request_id",
        "calls",
        ["settled", "pending", "last_received_at", "request_id"],
        postgresql_where=sa.text("NOT settled AND NOT pending"),
        sqlite_where=sa.text("settled = 0 AND pending = 0"),
    )
    op.create_index("ix_calls_call_no", "calls", ["call_no"], unique=True)

    op.create_table(
        "events",
        sa.Column("seq", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=128), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column("occurred_at", UTC_DATETIME, nullable=False),
        sa.Column("received_at", UTC_DATETIME, nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("output_tokens_delivered", sa.BigInteger(), nullable=True),
        sa.Column("output_tokens_generated", sa.BigInteger(), nullable=True),
        sa.Column("call_no", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("seq", name="pk_events"),
        sa.UniqueConstraint("event_id", name="uq_events_event_id"),
    )
    op.create_index("ix_events_call_no_seq", "events", ["call_no", "seq"])

    op.create_table(
        "ledger_entries",
        sa.Column("entry_id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=200), nullable=False),
        sa.Column("booked_at", UTC_DATETIME, nullable=False),
        sa.Column("api_key_id", sa.String(length=128), nullable=True),
        sa.Column("model", sa.String(length=256), nullable=True),
        sa.Column("protocol", sa.String(length=40), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("call_started_at", UTC_DATETIME, nullable=True),
        *_tokens(),
        sa.Column("price_id", sa.BigInteger(), nullable=True),
        sa.Column("input_uusd_per_mtok", sa.BigInteger(), nullable=True),
        sa.Column("output_uusd_per_mtok", sa.BigInteger(), nullable=True),
        sa.Column("cache_read_uusd_per_mtok", sa.BigInteger(), nullable=True),
        sa.Column("cache_creation_uusd_per_mtok", sa.BigInteger(), nullable=True),
        sa.Column("cost_pusd", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("entry_id", name="pk_ledger_entries"),
        sa.UniqueConstraint("request_id", "seq", name="uq_ledger_entries_request_id_seq"),
    )
    op.create_index(
        "ix_ledger_entries_booked_at_entry_id", "ledger_entries", ["booked_at", "entry_id"]
    )

    op.create_table(
        "prices",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("effective_from", UTC_DATETIME, nullable=False),
        sa.Column("input_uusd_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("output_uusd_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("cache_read_uusd_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("cache_creation_uusd_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_prices"),
        sa.UniqueConstraint("model", "effective_from", name="uq_prices_model_effective_from"),
    )

    op.create_table(
        "call_attempts",
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("usage_source", sa.String(length=16), nullable=False),
        *_tokens(),
        sa.Column("error_type", sa.String(length=64), nullable=True),
        sa.Column("stop_reason", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["request_id"], ["calls.request_id"], name="fk_call_attempts_request_id_calls"
        ),
        sa.PrimaryKeyConstraint("request_id", "attempt", name="pk_call_attempts"),
    )

    op.create_table(
        "usage_rollup_keyless",
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("request_id", name="pk_usage_rollup_keyless"),
    )
    op.create_table(
        "usage_rollups",
        sa.Column("basis", sa.String(length=16), nullable=False),
        sa.Column("api_key_id", sa.String(length=128), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket_start", UTC_DATETIME, nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        *_rollup_totals(),
        sa.PrimaryKeyConstraint(
            "basis", "api_key_id", "level", "bucket_start", "model", name="pk_usage_rollups"
        ),
    )
    op.create_index(
        "ix_usage_rollups_basis_level_bucket_start",
        "usage_rollups",
        ["basis", "level", "bucket_start"],
    )
    op.create_table(
        "usage_rollups_all_keys",
        sa.Column("basis", sa.String(length=16), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket_start", UTC_DATETIME, nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        *_rollup_totals(),
        sa.PrimaryKeyConstraint(
            "basis", "level", "bucket_start", "model", name="pk_usage_rollups_all_keys"
        ),
    )


def downgrade() -> None:
    op.drop_table("usage_rollups_all_keys")
    op.drop_table("usage_rollups")
    op.drop_table("usage_rollup_keyless")
    op.drop_table("call_attempts")
    op.drop_table("prices")
    op.drop_table("ledger_entries")
    op.drop_table("events")
    op.drop_table("calls")  # on PostgreSQL with calls_call_no_seq, which it owns
    op.drop_table("api_tokens")
