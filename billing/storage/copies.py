"""Copies of insert-only rows kept in memory per process and database, checked by numbers.

A copy (a model's prices, a plan's versions) is never trusted by its age: its owner reads, in
a statement of the caller's session, how many rows the copy's key has and their highest id,
and the copy is used only when it was loaded at those numbers. Rows that are only ever
inserted change those numbers with every row committed since, whatever the order its id was
drawn in (``billing.pricing.cache``, ``billing.plans.cache`` say why each holds).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

V = TypeVar("V")


class VersionedCopies(Generic[V]):
    """Per engine (a process may open several databases; an engine dropped takes its copies):
    key → (the numbers it was loaded at, the copy); at most ``most`` keys an engine, beyond
    which every copy is dropped and loaded again on demand."""

    def __init__(self, most: int) -> None:
        self._most = most
        self._copies: weakref.WeakKeyDictionary[Engine, dict[Hashable, tuple[Any, V]]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def get(self, session: Session, key: Hashable, numbers: Any, load: Callable[[], V]) -> V:
        """The copy of ``key`` kept at ``numbers`` (read by a statement of ``session`` before
        any row ``load`` reads), else ``load()``'s answer, kept under them."""
        engine: Engine = session.get_bind().engine
        kept_here = self._copies.get(engine)
        kept = None if kept_here is None else kept_here.get(key)
        if kept is not None and kept[0] == numbers:
            return kept[1]
        loaded = load()
        with self._lock:
            kept_here = self._copies.setdefault(engine, {})
            if len(kept_here) >= self._most:
                kept_here.clear()
            kept_here[key] = (numbers, loaded)
        return loaded
