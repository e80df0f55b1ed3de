"""Storing provider report pages (CONTRACT "Provider reports and drift").

A page's buckets are stored one by one, beside the ledger (never blended with it). A bucket is
versioned: its first import is version 1; an import with other figures adds the next version,
which supersedes the earlier ones (they stay, as history); an import with the same figures adds
nothing. Concurrent imports of one page store it once: the version insert is an
insert-on-conflict on the unique (bucket, version), so the import that loses the race reads the
winner's version and compares again, never a read-then-write race.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.orm import Session

from billing.money import format_usd
from billing.providers.repository import repository
from billing.providers.rows import BucketKey
from billing.providers.schemas import ImportResult, ReportBucket, ReportLine

#: The line fields that are figures: a bucket's content hash covers them (and nothing else:
#: a provider adding an unrelated field to its objects changes nothing stored).
_FIGURES = (
    "model",
    "upstream_account",
    "service_tier",
    "requests",
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens",
)


def _json_default(value: Any) -> str:
    if isinstance(value, Decimal):
        return format_usd(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _columns(line: ReportLine, line_no: int) -> dict[str, Any]:
    columns: dict[str, Any] = {name: getattr(line, name) for name in _FIGURES}
    columns["cost_usd"] = None if line.cost_usd is None else format_usd(line.cost_usd)
    columns["line_no"] = line_no
    # The result as received; a number read as Decimal is written back as the same digits.
    columns["result"] = json.dumps(line.result, default=_json_default, separators=(",", ":"))
    return columns


def content_hash(lines: Sequence[dict[str, Any]]) -> str:
    """SHA-256 of a bucket's figures (``_FIGURES`` and ``cost_usd`` of every line), whatever
    the order of its lines."""
    figures = sorted(json.dumps([line[name] for name in (*_FIGURES, "cost_usd")]) for line in lines)
    return hashlib.sha256("\n".join(figures).encode()).hexdigest()


def store_bucket(
    session: Session, provider: str, kind: str, bucket: ReportBucket, now: datetime
) -> str:
    """Store one bucket; returns ``new``, ``changed`` or ``unchanged``."""
    repo = repository(session)
    key = BucketKey(provider, kind, bucket.start, bucket.end)
    lines = [_columns(line, no) for no, line in enumerate(bucket.lines, 1)]
    digest = content_hash(lines)
    while True:
        current = repo.current_version(session, key)
        if current is not None and current[1] == digest:
            return "unchanged"
        version = 1 if current is None else current[0] + 1
        version_id = repo.insert_version(session, key, version, digest, now)
        if version_id is not None:
            repo.insert_lines(session, version_id, lines)
            return "new" if version == 1 else "changed"
        # Another import stored this version first (and committed): compare with it.


def import_buckets(
    session: Session,
    provider: str,
    kind: str,
    buckets: Sequence[ReportBucket],
    now: datetime,
) -> ImportResult:
    """Store a page's buckets in the session's transaction; ``{"buckets", "new", "changed",
    "unchanged"}`` counts them."""
    counts = {"new": 0, "changed": 0, "unchanged": 0}
    # In bucket order, so that two imports of overlapping pages lock buckets in one order.
    for bucket in sorted(buckets, key=lambda b: (b.start, b.end)):
        counts[store_bucket(session, provider, kind, bucket, now)] += 1
    return ImportResult(buckets=len(buckets), **counts)
