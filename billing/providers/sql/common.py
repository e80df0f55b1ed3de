"""The provider reports' statements both databases share (``billing.providers.repository``),
built with SQLAlchemy on the ORM tables; each database's module gives its own ``insert`` (with
``on_conflict_do_nothing``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.orm import Session, aliased

from billing.providers.rows import BucketKey, CurrentLine
from billing.storage.models import ProviderReportLine, ProviderReportVersion

_V = ProviderReportVersion
_L = ProviderReportLine
_BUCKET = ("provider", "kind", "bucket_start", "bucket_end")


def _is(key: BucketKey) -> Any:
    return and_(
        _V.provider == key.provider,
        _V.kind == key.kind,
        _V.bucket_start == key.start,
        _V.bucket_end == key.end,
    )


class ProvidersCore:
    """``ProvidersRepository`` over a dialect's ``insert``."""

    insert: Callable[..., Any]

    def current_version(self, session: Session, key: BucketKey) -> tuple[int, str] | None:
        row = session.execute(
            select(_V.version, _V.content_hash).where(_is(key)).order_by(_V.version.desc()).limit(1)
        ).first()
        return None if row is None else (row[0], row[1])

    def insert_version(
        self, session: Session, key: BucketKey, version: int, content_hash: str, now: datetime
    ) -> int | None:
        statement = (
            self.insert(_V)
            .values(
                provider=key.provider,
                kind=key.kind,
                bucket_start=key.start,
                bucket_end=key.end,
                version=version,
                content_hash=content_hash,
                imported_at=now,
            )
            .on_conflict_do_nothing(index_elements=[*_BUCKET, "version"])
            .returning(_V.id)
        )
        return session.execute(statement).scalar()

    def insert_lines(
        self, session: Session, version_id: int, lines: Sequence[dict[str, Any]]
    ) -> None:
        if lines:
            session.execute(self.insert(_L), [{"version_id": version_id, **line} for line in lines])

    def current_lines(
        self, session: Session, provider: str | None, since: datetime, until: datetime
    ) -> list[CurrentLine]:
        later = aliased(_V)
        newer = (
            select(later.id)
            .where(
                later.provider == _V.provider,
                later.kind == _V.kind,
                later.bucket_start == _V.bucket_start,
                later.bucket_end == _V.bucket_end,
                later.version > _V.version,
            )
            .exists()
        )
        query = (
            select(
                _V.provider,
                _V.kind,
                _V.bucket_start,
                _V.bucket_end,
                _L.model,
                _L.upstream_account,
                _L.service_tier,
                _L.requests,
                _L.input_tokens,
                _L.cache_read_input_tokens,
                _L.cache_creation_input_tokens,
                _L.output_tokens,
                _L.cost_usd,
            )
            .join(_L, _L.version_id == _V.id)
            .where(_V.bucket_start >= since, _V.bucket_start < until, ~newer)
            .order_by(_V.bucket_start, _V.id, _L.line_no)
        )
        if provider is not None:
            query = query.where(_V.provider == provider)
        return [CurrentLine(*row) for row in session.execute(query)]  # type: ignore[call-arg]
