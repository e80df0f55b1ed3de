"""The drift's rollup of ours (``drift_rollups``, ``billing.storage.models.DriftRollup``), kept
by the reconciler in each step's transaction; read by ``billing.drift``.

It holds the settled calls that have a ``stream.started``, each with its current figures, in
the UTC hour of its start: ingest never changes such a call's start, labels or figures (it only
fills them in for a call without ``stream.started``), so only a reconciliation step does, and
the step takes the call's old contribution out and puts the new one in. The other calls (not
settled, or settled without ``stream.started``) are read from ``calls`` by the drift
(``DriftRepository.ours``). The statements are the rollups' (``billing.rollups.repository``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from billing.anomalies import STARTED_MISSING
from billing.rollups.repository import repository
from billing.rollups.rows import DAY, HOUR, Contributions


def holds(call: Any) -> bool:
    """Whether ``drift_rollups`` holds ``call`` (a ``rollups.CallLike``): settled, with a
    ``stream.started``."""
    return bool(call.settled) and STARTED_MISSING not in (call.anomalies or ())


def before_writes(session: Session, calls: Iterable[Any]) -> Contributions:
    """What ``drift_rollups`` holds for those of ``calls`` (as stored, before the step writes
    them) it holds."""
    ids = [call.request_id for call in calls if holds(call)]
    return repository(session).drift_contributions(session, ids) if ids else {}


def after_writes(
    session: Session,
    before: Contributions,
    request_ids: Sequence[str],
    added: Contributions | None = None,
) -> None:
    """Replace ``before`` by what the calls ``request_ids`` (those the rollup holds, as the step
    wrote them, read back from ``calls``) and ``added`` (the contributions of calls the caller
    summed already: the fast path's, ``billing.reconcile.fastpath.settle_common``) add, in the
    rows of their hours and days: one upsert, rows in key order (one lock order for every
    reconciler), rows that change nothing left out."""
    store = repository(session)
    deltas: dict[tuple[Any, ...], list[int]] = {}
    changes = [(key, sums, -1) for key, sums in before.items()]
    if added:
        changes += [(key, sums, 1) for key, sums in added.items()]
    if request_ids:
        changes += [
            (key, sums, 1) for key, sums in store.drift_contributions(session, request_ids).items()
        ]
    days: dict[Any, Any] = {}
    for (hour, *labels), sums, sign in changes:
        day = days.get(hour)
        if day is None:
            day = days[hour] = store.drift_day_of(hour)
        for row in ((HOUR, hour, *labels), (DAY, day, *labels)):
            old = deltas.get(row)
            signed = [sign * value for value in sums]
            deltas[row] = (
                signed if old is None else [a + b for a, b in zip(old, signed, strict=True)]
            )
    store.add_drift(session, [(*row, *deltas[row]) for row in sorted(deltas) if any(deltas[row])])


def rebuild(session: Session) -> None:
    """Recompute ``drift_rollups`` from ``calls``, set-based (a repair, a seeded benchmark).
    Runs in the caller's transaction."""
    repository(session).rebuild_drift(session)
