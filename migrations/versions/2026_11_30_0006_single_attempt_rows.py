"""call_attempts: no row for a call with one attempt

A call with one attempt is its attempt: its ``calls`` row holds the same figures, model, status,
usage source, error type and stop reason, so its ``call_attempts`` row said nothing more (the
reconciler's only reader, ``mark_model_pending``, finds such a call by ``calls.model``). From this
revision the reconciler writes attempt rows only for calls with more than one attempt (one row
fewer per call, and on PostgreSQL one foreign-key check fewer); this removes the rows written for
the others before. Downgrade leaves the table as it is: the previous code reads the rows only
to find calls by an attempt's model, which ``calls.model`` covers for these calls.

Revision ID: 6c2f8a4e1b37
Revises: 5a1c7e3d9b20
Create Date: 2026-11-30 12:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "6c2f8a4e1b37"
down_revision: str | None = "5a1c7e3d9b20"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "DELETE FROM call_attempts WHERE request_id IN "
        "(SELECT request_id FROM calls WHERE attempts <= 1)"
    )


def downgrade() -> None:
    pass
