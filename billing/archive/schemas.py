"""The archive's shapes: a month, and the manifest of a directory of archived months."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from pydantic import BaseModel, Field

#: The manifest's file name in an archive directory.
MANIFEST = "manifest.json"
_MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


class Month(BaseModel, frozen=True):
    """A calendar month of ``occurred_at`` in UTC."""

    year: int = Field(ge=1, le=9998)
    month: int = Field(ge=1, le=12)

    @classmethod
    def parse(cls, text: str) -> Month:
        """``YYYY-MM``; ``ValueError`` naming the expected form otherwise."""
        found = _MONTH.match(text)
        if found is None:
            raise ValueError(f"{text!r} is not a month: use YYYY-MM, such as 2026-11")
        return cls(year=int(found.group(1)), month=int(found.group(2)))

    @classmethod
    def of(cls, when: datetime) -> Month:
        when = when.astimezone(UTC)
        return cls(year=when.year, month=when.month)

    @property
    def start(self) -> datetime:
        return datetime(self.year, self.month, 1, tzinfo=UTC)

    def next(self) -> Month:
        return Month(year=self.year + self.month // 12, month=self.month % 12 + 1)

    @property
    def label(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @property
    def file_name(self) -> str:
        return f"events-{self.label}.parquet"


class ArchivedMonth(BaseModel):
    """One month's file: its rows (events), their ``seq`` range and the file's SHA-256."""

    month: str
    file: str
    rows: int = Field(ge=0)
    first_seq: int | None
    last_seq: int | None
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    archived_at: str


class Manifest(BaseModel):
    """``manifest.json`` of an archive directory: its months, oldest first."""

    format: str = "billing-events-archive/1"
    months: list[ArchivedMonth] = []

    def with_month(self, entry: ArchivedMonth) -> Manifest:
        """This manifest with ``entry`` added, or replacing the entry of the same file."""
        kept = [m for m in self.months if m.file != entry.file]
        return Manifest(format=self.format, months=sorted([*kept, entry], key=lambda m: m.month))

    def entry(self, file: str) -> ArchivedMonth | None:
        return next((m for m in self.months if m.file == file), None)
