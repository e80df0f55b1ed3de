"""A count of the drains running in a process, bounded (safe from threads and the event loop)."""

from __future__ import annotations

import threading

__all__ = ["DrainSlots"]


class DrainSlots:
    """At most ``limit`` drains at once: :meth:`take` a slot or be told there is none."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._running = 0
        self._idle = threading.Event()
        self._idle.set()

    def take(self) -> bool:
        """Take a slot; ``False`` when ``limit`` drains are running (nothing taken)."""
        with self._lock:
            if self._running >= self.limit:
                return False
            self._running += 1
            self._idle.clear()
            return True

    def give_back(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self._idle.set()

    @property
    def running(self) -> int:
        """Drains running now."""
        return self._running

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no drain runs (``timeout`` seconds at most); ``True`` when none runs."""
        return self._idle.wait(timeout)
