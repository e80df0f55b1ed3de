"""The SQL of the observability room, as a ``Protocol``, and ``repository(session)``, which
gives its implementation (``billing.observe.sql.common``: the same statements on both
databases). Every method runs in the session's transaction.

Tables read (``billing.storage.models``): ``usage_rollups_all_keys`` (month rows),
``drift_rollups`` (day rows: which provider served a model), ``calls`` (the reconciler's due
indexes) and ``webhook_outbox``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from sqlalchemy.orm import Session

from billing.observe.rows import ModelTotals
from billing.observe.sql.common import SqlObserve
from billing.storage.dialects import ByDialect


class ObserveRepository(Protocol):
    def model_totals(self, session: Session) -> dict[str, ModelTotals]:
        """Per model (``''`` for none): the ledger's tokens, cost and charge (the ``booked``
        rollups) and the settled calls without a cost now (the ``call_start`` rollups)."""
        ...

    def model_providers(self, session: Session) -> list[tuple[str, str]]:
        """The distinct (model, provider) pairs of the settled calls (``''`` for none)."""
        ...

    def oldest_due(
        self, session: Session, cutoff: datetime
    ) -> tuple[datetime | None, datetime | None]:
        """The last event of the oldest pending call, and of the oldest open call quiet since
        ``cutoff`` (both due to the reconciler), or ``None``."""
        ...

    def calls_by_status(
        self, session: Session, statuses: Sequence[str], since: datetime, until: datetime
    ) -> dict[str, int]:
        """How many calls of each status started in ``[since, until)``."""
        ...

    def failing_deliveries(self, session: Session) -> int:
        """The alert webhooks whose latest attempt failed: given up (``failed``) or still
        retrying (``pending`` after at least one attempt; a success makes a row
        ``delivered``). CONTRACT "Observability and standard exports (v3)": failing alert
        deliveries."""
        ...

    def deliveries_by_state(self, session: Session) -> dict[str, int]:
        """The webhook outbox's rows by ``state`` (``pending``, ``delivered``, ``failed``)."""
        ...


_REPOSITORIES: ByDialect[ObserveRepository] = ByDialect(
    sqlite=SqlObserve(), postgresql=SqlObserve()
)


def repository(session: Session) -> ObserveRepository:
    return _REPOSITORIES.of(session)
