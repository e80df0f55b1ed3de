"""``billing.storage.db.WriteLock``: the in-process queue for SQLite's one write lock, where a
request's write (``urgent``) goes ahead of the background writers waiting with it."""

from __future__ import annotations

import threading
import time

from billing.storage.db import WriteLock


def _waiting(lock: WriteLock, thread: threading.Thread) -> None:
    """Give ``thread`` time to block on ``lock`` (it cannot get it while the test holds it)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.02)
        if thread.is_alive():
            return
    raise AssertionError("the thread did not start waiting")


def test_an_urgent_waiter_goes_before_those_that_waited_longer() -> None:
    lock = WriteLock()
    order: list[str] = []

    def take(name: str, urgent: bool) -> None:
        lock.acquire(urgent)
        order.append(name)
        time.sleep(0.01)
        lock.release()

    lock.acquire()
    background = [threading.Thread(target=take, args=(f"step{i}", False)) for i in range(3)]
    for thread in background:
        thread.start()
        _waiting(lock, thread)
    time.sleep(0.05)  # the background writers are all waiting
    urgent = threading.Thread(target=take, args=("authorization", True))
    urgent.start()
    deadline = time.monotonic() + 5
    while lock._urgent == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    lock.release()
    for thread in [*background, urgent]:
        thread.join(5)
    assert order[0] == "authorization"
    assert sorted(order[1:]) == ["step0", "step1", "step2"]


def test_the_lock_is_reentrant_and_excludes_other_threads() -> None:
    lock = WriteLock()
    inside = 0
    most = 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, most
        for _ in range(200):
            with lock, lock:  # re-entered by its holder
                with guard:
                    inside += 1
                    most = max(most, inside)
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert (inside, most) == (0, 1)


def test_only_the_holder_releases() -> None:
    lock = WriteLock()
    lock.acquire()
    failed: list[BaseException] = []

    def other() -> None:
        try:
            lock.release()
        except RuntimeError as error:
            failed.append(error)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(5)
    assert len(failed) == 1
    lock.release()
    lock.acquire(urgent=True)  # free again
    lock.release()
