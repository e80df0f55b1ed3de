"""Provider report buckets and their lines (CONTRACT "Provider reports and drift")."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from billing.storage.models.base import (
    Base,
    BigId,
)
from billing.storage.types import UTCDateTime


class ProviderReportVersion(Base):
    """One version of one provider report bucket (CONTRACT "Provider reports and drift").

    A bucket is (provider, kind, bucket_start, bucket_end), in UTC as the provider gives it;
    ``version`` counts from 1, and the highest is current. Rows are only ever added: a
    re-import with other figures adds version n + 1 (``content_hash``: SHA-256 of the bucket's
    lines), the same figures add nothing. ``(provider, kind, bucket_start, bucket_end,
    version)`` is unique, so concurrent imports of one page store it once
    (``billing.providers.service``).
    """

    __tablename__ = "provider_report_versions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    provider: Mapped[str] = mapped_column(String(32), nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    bucket_end: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    content_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    imported_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)

    __table_args__ = (
        UniqueConstraint(
            "provider",
            "kind",
            "bucket_start",
            "bucket_end",
            "version",
            name="uq_provider_report_versions_bucket_version",
        ),
        Index(None, "bucket_start", "provider", "kind"),
    )


class ProviderReportLine(Base):
    """One result of a provider report bucket version, in the contract's token semantics.

    Token counts are integers (null where the report has no such figure: a cost line has no
    tokens, Anthropic's usage report no request count); ``cost_usd`` is the exact decimal text
    in USD (OpenAI's dollars read from the JSON text, Anthropic's cents divided by 100): provider
    amounts carry more decimals than any integer unit would hold, and a report holds few lines,
    summed as ``Decimal``. ``result`` is the provider's result object as received.
    """

    __tablename__ = "provider_report_lines"

    version_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("provider_report_versions.id"), primary_key=True
    )
    line_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str | None] = mapped_column(String(256))
    upstream_account: Mapped[str | None] = mapped_column(String(128))
    service_tier: Mapped[str | None] = mapped_column(String(32))
    requests: Mapped[int | None] = mapped_column(BigInteger)
    input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cache_read_input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cache_creation_input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    output_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cost_usd: Mapped[str | None] = mapped_column(String(64))
    result: Mapped[str] = mapped_column(Text, nullable=False)
