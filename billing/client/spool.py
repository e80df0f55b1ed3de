"""The spool: an append-only JSON-lines file of the events the service could not take yet."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import orjson
import platformdirs
from filelock import FileLock, Timeout

from billing.client.wire import HEAD, TAIL

#: The default bound of a spool file (with the one being replayed): 256 MiB.
DEFAULT_MAX_SPOOL_BYTES = 256 * 2**20


@dataclass(frozen=True, slots=True)
class Item:
    """One queued event: its sequence number (0 when read from the spool), its id, its JSON
    bytes, and when it was queued (``time.monotonic()`` seconds)."""

    seq: int
    event_id: str
    data: bytes
    queued_at: float


class Spool:
    """The append-only JSON-lines spool: one event (compact JSON) per line.

    New events are appended to ``path`` (and fsync'ed). To replay, the file is first renamed to
    ``path + ".replay"`` (an atomic rename, so appends go on into a fresh ``path``), then read
    in order, a batch at a time; the read position advances only after the service acknowledged
    the batch, and the file is deleted once fully acknowledged. If the process dies mid-replay,
    the ``.replay`` file is replayed again from its start by the next client: events already
    stored come back as duplicates, so nothing is lost and nothing is billed twice. A line left
    half-written by a crash is skipped and reported.

    One process at a time may use a spool path (``lock``, when given, is held for it and
    released by :meth:`release`). Its size is bounded: past ``max_bytes`` (the new file and the
    one being replayed together) :meth:`append` writes no more. Thread-safe.
    """

    def __init__(
        self, path: Path, lock: FileLock | None = None, max_bytes: int = DEFAULT_MAX_SPOOL_BYTES
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._claim = lock
        self.replay_path = path.with_name(path.name + ".replay")
        self._lock = threading.Lock()
        self._offset = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._end_with_newline(self.path)
        self._end_with_newline(self.replay_path)

    @staticmethod
    def _end_with_newline(path: Path) -> None:
        """Terminate a line cut short by a crash, so that the next append starts a new line."""
        with contextlib.suppress(FileNotFoundError), open(path, "rb+") as file:
            file.seek(0, os.SEEK_END)
            if file.tell() == 0:
                return
            file.seek(-1, os.SEEK_END)
            if file.read(1) != b"\n":
                file.write(b"\n")
                file.flush()
                os.fsync(file.fileno())

    def release(self) -> None:
        """Give up the claim on the path (what is left in it waits for the next owner)."""
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    def append(self, items: Iterable[Item]) -> int:
        """Append events durably (written and fsync'ed), in order, as far as they fit under
        ``max_bytes``; returns how many (the caller reports the others as lost)."""
        lines = [item.data + b"\n" for item in items]
        if not lines:
            return 0
        with self._lock:
            room = self.max_bytes - _size(self.path) - _size(self.replay_path)
            fitting = 0
            for line in lines:
                room -= len(line)
                if room < 0:
                    break
                fitting += 1
            lines = lines[:fitting]
            if not lines:
                return 0
        with self._lock, open(self.path, "ab") as file:
            file.write(b"".join(lines))
            file.flush()
            os.fsync(file.fileno())
        return len(lines)

    def pending(self) -> bool:
        """Whether the spool holds events not yet acknowledged."""
        with self._lock:
            return self.replay_path.exists() or _size(self.path) > 0

    def read_batch(self, max_events: int, max_bytes: int) -> tuple[list[Item], int, int]:
        """The next events to replay, in file order: ``(items, end_offset, unreadable_lines)``.

        ``end_offset`` is what to pass to :meth:`commit` once the items are acknowledged.
        Returns no items and ``end_offset`` 0 when the spool is empty.
        """
        with self._lock:
            if not self.replay_path.exists():
                if _size(self.path) == 0:
                    return [], 0, 0
                os.replace(self.path, self.replay_path)
                self._offset = 0
            offset = self._offset
        items: list[Item] = []
        unreadable = 0
        size = len(HEAD) + len(TAIL)
        with open(self.replay_path, "rb") as file:
            file.seek(offset)
            while len(items) < max_events:
                line = file.readline()
                if not line:
                    break
                data = line.rstrip(b"\r\n")
                event_id = _spooled_event_id(data)
                if event_id is None:
                    if data.strip():
                        unreadable += 1
                    offset += len(line)
                    continue
                if items and size + len(data) + 1 > max_bytes:
                    break
                size += len(data) + 1
                items.append(Item(0, event_id, data, 0.0))
                offset += len(line)
        return items, offset, unreadable

    def commit(self, end_offset: int) -> None:
        """Mark everything before ``end_offset`` of the replay file as acknowledged; delete the
        file once it is all acknowledged."""
        with self._lock:
            self._offset = end_offset
            if end_offset >= _size(self.replay_path):
                with contextlib.suppress(FileNotFoundError):
                    self.replay_path.unlink()
                self._offset = 0


class DefaultSpool:
    """The type of :data:`DEFAULT_SPOOL`: "a spool file of this process in the user's cache
    directory" (see :func:`claim_default_spool`)."""

    def __repr__(self) -> str:
        return "DEFAULT_SPOOL"


#: The default of ``spool_path``: a spool in the per-user cache directory.
DEFAULT_SPOOL: Final = DefaultSpool()

#: How many processes may spool for the same service on one machine at once (one file each).
MAX_SPOOL_SLOTS = 64


def default_spool_dir() -> Path:
    """``billing/spool`` in the user's cache directory (``platformdirs.user_cache_dir``:
    ``$XDG_CACHE_HOME/billing/spool``, by default ``~/.cache/billing/spool`` on Linux)."""
    return Path(platformdirs.user_cache_dir("billing")) / "spool"


def claim_default_spool(endpoint: str) -> tuple[Path, FileLock]:
    """A spool file for the events of ``endpoint``, owned by this process until it exits or
    releases the returned lock: ``<default_spool_dir>/<host-port>-<hash>-<n>.jsonl`` with the
    first slot ``n`` that no other live process holds (an exclusive lock on its ``.lock``
    file). A slot left by a process that is gone is taken over, so its events are replayed;
    the name carries the endpoint, so they go to the service they were meant for.

    Raises:
        RuntimeError: all :data:`MAX_SPOOL_SLOTS` slots are held by other processes.
    """
    directory = default_spool_dir()
    directory.mkdir(parents=True, exist_ok=True)
    where = endpoint.split("://", 1)[-1].split("/", 1)[0]
    label = "".join(c if c.isalnum() else "-" for c in where)[:64]
    digest = hashlib.sha256(endpoint.encode()).hexdigest()[:12]
    for slot in range(MAX_SPOOL_SLOTS):
        path = directory / f"{label}-{digest}-{slot}.jsonl"
        lock = FileLock(path.with_name(path.name + ".lock"), thread_local=False)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue
        return path, lock
    raise RuntimeError(
        f"all {MAX_SPOOL_SLOTS} spool slots in {directory} are in use; pass spool_path"
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _spooled_event_id(data: bytes) -> str | None:
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if isinstance(event, dict):
        event_id = event.get("event_id")
        if isinstance(event_id, str) and event_id:
            return event_id
    return None
