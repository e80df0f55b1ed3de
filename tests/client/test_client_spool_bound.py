"""The spool's bound (``max_spool_bytes``): past it, events are dropped and reported, never
written; the default bound and the default place of the spool."""

from __future__ import annotations

from pathlib import Path

import pytest

from billing.client import (
    DEFAULT_MAX_SPOOL_BYTES,
    BillingClient,
    DeliveryError,
    default_spool_dir,
)
from tests.client.test_client import tokens_event
from tests.conftest import _free_port

pytestmark = pytest.mark.nodb


def _lines(spool: Path) -> list[bytes]:
    return [
        line
        for path in (spool, spool.with_name(spool.name + ".replay"))
        if path.exists()
        for line in path.read_bytes().splitlines(keepends=True)
    ]


def test_past_its_bound_the_spool_takes_no_more_and_each_loss_is_reported(
    tmp_path: Path,
) -> None:
    spool = tmp_path / "events.spool"
    problems: list[DeliveryError] = []
    client = BillingClient(
        f"http://127.0.0.1:{_free_port()}",  # nothing listens: the service is down
        spool_path=spool,
        max_spool_bytes=1000,
        flush_interval_s=60,
        max_retries=0,
        on_error=problems.append,
    )
    ids = [client.send(tokens_event("req-b", n)) for n in range(12)]
    assert client.close(timeout=1) is False  # undelivered: to the spool, as far as it takes
    lines = _lines(spool)
    fit = 1000 // len(lines[0])
    assert 0 < fit < 12 and len(lines) == fit
    assert sum(len(line) for line in lines) <= 1000
    assert [ids[n].encode() in line for n, line in enumerate(lines)] == [True] * fit
    stats = client.stats()
    assert (stats.spooled, stats.dropped) == (fit, 12 - fit)
    dropped = [i for p in problems if p.kind == "dropped" for i in p.event_ids]
    assert dropped == ids[fit:]
    assert all("is full" in p.message for p in problems if p.kind == "dropped")


def test_the_default_spool_is_in_the_user_cache_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_spool_dir() == tmp_path / "billing" / "spool"
    assert DEFAULT_MAX_SPOOL_BYTES == 256 * 2**20
    with pytest.raises(ValueError, match="max_spool_bytes"):
        BillingClient("http://127.0.0.1:9", spool_path=None, max_spool_bytes=0)
