"""A reconciliation pass: bounded steps, one transaction each, until no call needs work."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

from sqlalchemy.orm import Session, sessionmaker

from billing.ingest.service import number_unnumbered
from billing.metrics import Metrics
from billing.reconcile.service import (
    StepResult,
    due_calls,
    lock_call,
    reconcile_calls,
    reconcile_step,
)
from billing.settings import Settings
from billing.storage.db import is_unavailable, read_transaction, write_transaction

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
    On PostgreSQL ``settings.reconcile_threads`` threads run steps at once: each step locks its
    calls (``FOR UPDATE SKIP LOCKED``), so no call is in two steps, and the rollup rows are
    locked in one order (no deadlock). Returns the totals of the pass; raises the database's
    error when it is unavailable.
    """
    threads = settings.reconcile_threads
    dialect = getattr(getattr(sessions.kw.get("bind"), "dialect", None), "name", "sqlite")
    if threads <= 1 or dialect == "sqlite":
        total = _run_steps(sessions, settings, metrics, now)
    else:
        results: list[StepResult] = []
        errors: list[BaseException] = []

        def work() -> None:
            try:
                results.append(_run_steps(sessions, settings, metrics, now))
            except BaseException as error:  # handed to the caller below
                errors.append(error)

        helpers = [
            threading.Thread(target=work, name="billing-reconcile-step", daemon=True)
            for _ in range(threads - 1)
        ]
        for helper in helpers:
            helper.start()
        work()
        for helper in helpers:
            helper.join()
        if errors:
            raise errors[0]
        total = StepResult()
        for result in results:
            total.add(result)
    if total.settled or total.adjusted:
        log.info("reconciled: %d settled, %d adjusted", total.settled, total.adjusted)
    return total


def _run_steps(
    sessions: sessionmaker[Session],
    settings: Settings,
    metrics: Metrics | None,
    now: datetime | None,
) -> StepResult:
    """Steps until one finds fewer than a batch of due calls (see ``run_pass``)."""
    total = StepResult()
    for _ in range(MAX_STEPS_PER_PASS):
        clock = now or datetime.now(UTC)
        try:
            with write_transaction(sessions) as session:
                number_unnumbered(session.connection())
                step = reconcile_step(
                    session, clock, settings.settle_after_s, settings.reconcile_batch_size
                )
        except Exception as error:
            if is_unavailable(error):
                raise
            # One call that cannot be booked must not hold back the others: redo this step one
            # call per transaction, leave the failing ones pending, and end the pass.
            log.exception("reconciliation step failed; retrying its calls one by one")
            step = _one_by_one(sessions, settings, clock)
            _count(metrics, step)
            total.add(step)
            break
        _count(metrics, step)
        total.add(step)
        if step.examined < settings.reconcile_batch_size:
            break
    return total


def _count(metrics: Metrics | None, step: StepResult) -> None:
    if metrics is not None:
        metrics.settled.inc(step.settled)
        metrics.adjustments.inc(step.adjusted)


def _one_by_one(sessions: sessionmaker[Session], settings: Settings, clock: datetime) -> StepResult:
    """Reconcile the due calls each in its own transaction; a failing call is logged and skipped
    (it stays pending, so the next pass tries it again)."""
    with read_transaction(sessions) as session:
        request_ids = due_calls(
            session, clock, settings.settle_after_s, settings.reconcile_batch_size, lock=False
        )
    total = StepResult()
    for request_id in request_ids:
        try:
            with write_transaction(sessions) as session:
                if lock_call(session, request_id):
                    total.add(
                        reconcile_calls(session, [request_id], clock, settings.settle_after_s)
                    )
        except Exception as error:
            if is_unavailable(error):
                raise
            log.exception("call %r could not be reconciled; it stays pending", request_id)
    return total
