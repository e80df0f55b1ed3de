"""A reconciliation pass: bounded steps, one transaction each, until no call needs work."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from sqlalchemy.orm import Session, sessionmaker

from billing.metrics import Metrics
from billing.reconcile.service import StepResult, reconcile_step
from billing.settings import Settings
from billing.storage.db import write_transaction

log = logging.getLogger("billing.reconcile")

#: A pass stops after this many steps even if work remains (the next pass goes on).
MAX_STEPS_PER_PASS = 10_000


def run_pass(
    sessions: sessionmaker[Session],
    settings: Settings,
    metrics: Metrics | None = None,
    now: datetime | None = None,
) -> StepResult:
    """Run steps of ``settings.reconcile_batch_size`` calls until none is due.

    ``now`` (timezone-aware UTC) fixes the clock for the whole pass; by default each step reads the
    current time. Each step commits on its own, so a pass killed midway leaves whole steps only.
    Returns the totals of the pass.
    """
    total = StepResult()
    for _ in range(MAX_STEPS_PER_PASS):
        with write_transaction(sessions) as session:
            step = reconcile_step(
                session,
                now or datetime.now(UTC),
                settings.settle_after_s,
                settings.reconcile_batch_size,
            )
        total.add(step)
        if metrics is not None:
            metrics.settled.inc(step.settled)
            metrics.adjustments.inc(step.adjusted)
        if step.examined < settings.reconcile_batch_size:
            break
    if total.settled or total.adjusted:
        log.info("reconciled: %d settled, %d adjusted", total.settled, total.adjusted)
    return total
