"""A month's events as a Parquet file (pyarrow, the optional extra ``billing[archive]``): one
row group per chunk read, columns typed as the table's (timestamps in microseconds, UTC), so a
restore gives back the very values."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from billing.archive.rows import EventRecord
from billing.archive.sql.common import COLUMNS, REQUIRED


class ArchiveUnavailable(RuntimeError):
    """pyarrow is not installed."""


def _arrow() -> tuple[ModuleType, ModuleType]:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:  # pragma: no cover - the extra is installed in the tests
        raise ArchiveUnavailable("archives need pyarrow: pip install 'billing[archive]'") from None
    return pyarrow, pyarrow.parquet


def schema() -> Any:
    """The Parquet schema, in ``COLUMNS`` order."""
    pa, _ = _arrow()
    stamp = pa.timestamp("us", tz="UTC")
    types = {
        "seq": pa.int64(),
        "attempt": pa.int32(),
        "occurred_at": stamp,
        "received_at": stamp,
        "output_tokens_delivered": pa.int64(),
        "output_tokens_generated": pa.int64(),
        "call_no": pa.int64(),
        "plain_usage": pa.bool_(),
    }
    return pa.schema(
        [
            pa.field(name, types.get(name, pa.string()), nullable=name not in REQUIRED)
            for name in COLUMNS
        ]
    )


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class MonthWriter:
    """Writes row groups to ``<path>.partial``; ``finish`` makes it durable under ``path``."""

    def __init__(self, path: Path) -> None:
        _, pq = _arrow()
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self.schema = schema()
        self.writer = pq.ParquetWriter(self.partial, self.schema, compression="zstd")
        self.rows = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None

    def write(self, rows: list[EventRecord]) -> None:
        pa, _ = _arrow()
        if not rows:
            return
        columns = list(zip(*rows, strict=True))
        self.writer.write_table(pa.Table.from_arrays(columns, schema=self.schema))
        self.rows += len(rows)
        self.first_seq = rows[0][0] if self.first_seq is None else self.first_seq
        self.last_seq = rows[-1][0]

    def finish(self) -> str:
        """Close, flush to disk, move into place; the file's SHA-256."""
        self.writer.close()
        with open(self.partial, "rb") as file:
            os.fsync(file.fileno())
        os.replace(self.partial, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return sha256(self.path)

    def abandon(self) -> None:
        self.writer.close()
        self.partial.unlink(missing_ok=True)


def read_rows(path: Path) -> Iterator[list[EventRecord]]:
    """The file's rows, one row group at a time, as tuples in ``COLUMNS`` order."""
    _, pq = _arrow()
    file = pq.ParquetFile(path)
    if [field.name for field in file.schema_arrow] != list(COLUMNS):
        raise ValueError(f"{path} is not an archive of events (its columns differ)")
    for group in range(file.num_row_groups):
        table = file.read_row_group(group)
        yield list(zip(*(table.column(name).to_pylist() for name in COLUMNS), strict=True))
