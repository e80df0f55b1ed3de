"""The rows that cross the archive's repository: an ``events`` row as a tuple in
``billing.archive.sql.common.COLUMNS`` order."""

from __future__ import annotations

from typing import Any

#: The values of one ``events`` row, in the table's column order (``COLUMNS``).
EventRecord = tuple[Any, ...]
