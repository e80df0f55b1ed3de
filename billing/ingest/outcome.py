"""Whether a transaction whose COMMIT lost its answer was committed.

When the connection breaks while COMMIT is under way, PostgreSQL may have committed although the
client never heard back. Answering 503 would then be untrue: CONTRACT "Ingest" says a 503 stored
nothing. So a thread of its own (the writer goes on with other batches meanwhile: during an
outage they get their 503 at once) asks the database again, on fresh connections, whether the
events that transaction inserted are stored: all of them (it committed: answer as committed),
none (it did not: 503 is true) or, while the database cannot be reached, unknown
(``CommitOutcomeUnknown``, a 503 that says so; retrying the same batch is answered as
duplicates for whatever was stored).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from billing.errors import CommitOutcomeUnknown
from billing.ingest.repository import repository
from billing.ingest.service import CommitUnanswered, IngestResult
from billing.storage.db import is_unavailable

#: How long the writer keeps asking before answering that the outcome is unknown (seconds).
CHECK_FOR_S = 5.0
#: Pause between two attempts to reach the database (seconds).
CHECK_EVERY_S = 0.25
#: Event ids per lookup statement.
_CHUNK = 500


def stored_share(sessions: sessionmaker[Session], digests: Mapping[str, str]) -> float:
    """The share (0.0 to 1.0) of ``digests`` (event_id -> content hash) stored with that hash,
    read on a fresh connection. Raises the database's error when it cannot be reached."""
    ids = list(digests)
    found = 0
    with sessions() as session:
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            conn = session.connection()
            rows = repository(conn).stored_hashes(conn, chunk)
            found += sum(1 for event_id, digest in rows.items() if digests[event_id] == digest)
        session.rollback()
    return found / len(ids) if ids else 1.0


def committed(
    sessions: sessionmaker[Session],
    digests: Mapping[str, str],
    check_for_s: float = CHECK_FOR_S,
) -> bool | None:
    """Whether the transaction that inserted ``digests`` (event_id -> content hash) committed:
    True when all of them are stored (whoever stored them: the answer "stored" is true), False
    when none is, None when the database could not be reached for ``check_for_s`` seconds or
    only some are stored (the transaction is atomic, so it did not commit, but another request
    stored some of the same events: neither "stored" nor "nothing stored" is true)."""
    deadline = time.monotonic() + check_for_s
    while True:
        try:
            share = stored_share(sessions, digests)
        except SQLAlchemyError as error:
            if not is_unavailable(error) or time.monotonic() >= deadline:
                return None
            time.sleep(CHECK_EVERY_S)
            continue
        if share == 1.0:
            return True
        return False if share == 0.0 else None


def settle_unanswered(
    sessions: sessionmaker[Session],
    unanswered: CommitUnanswered,
    check_for_s: float = CHECK_FOR_S,
) -> list[IngestResult | BaseException]:
    """What each batch of a group whose COMMIT went unanswered is answered (item ``i`` for
    ``unanswered.results[i]``): its result when the transaction committed, the database's error
    (a 503 "nothing was stored") when it did not, ``CommitOutcomeUnknown`` when that cannot be
    told. Blocks up to ``check_for_s`` seconds while the database cannot be reached."""
    outcome = committed(sessions, unanswered.new, check_for_s)
    if outcome is True:
        return list(unanswered.results)
    error = (unanswered.__cause__ or unanswered) if outcome is False else CommitOutcomeUnknown()
    return [error] * len(unanswered.results)
