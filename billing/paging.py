"""One page of a list read ``limit + 1`` rows at a time: the extra row only says that another
page follows (the key, customer, budget and per-call drift lists)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def cut_page(found: Sequence[T], limit: int) -> tuple[list[T], T | None]:
    """``found`` (read with ``limit + 1``) as ``(page, last)``: the first ``limit`` rows, and
    the page's last row when another page follows (its position is the next cursor), else
    ``None``."""
    page = list(found[:limit])
    return page, page[-1] if len(found) > limit and page else None
