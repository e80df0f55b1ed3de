"""The price an authorization's estimate is held at is the price in force as the database has
it, whoever posted it (``billing.pricing.cache``: a copy per process, checked against the
prices' count and highest id on every lookup). Two apps on one database stand for two
processes or replicas, each with its own engine and copy; on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from billing.pricing.schemas import PriceIn
from billing.pricing.service import add_price
from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.db import write_transaction
from tests.budgets.helpers import PRICE, price, state
from tests.budgets.test_holds import auth_at, body
from tests.conftest import PG_URL

T0 = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)


def _ts(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


@pytest.fixture
def two(settings: Settings) -> Iterator[tuple[TestClient, TestClient]]:
    """Two services on one database (each its own engine, its own copy of the prices)."""
    with (
        TestClient(create_app(settings), base_url="http://127.0.0.1") as first,
        TestClient(create_app(settings), base_url="http://127.0.0.1") as second,
    ):
        yield first, second


def test_a_price_posted_by_another_process_is_used_by_the_next_authorization(
    two: tuple[TestClient, TestClient],
) -> None:
    first, second = two
    price(first)  # $1 / $2 per Mtok from 2026-01-01
    out = first.post("/v1/authorizations", json=body("r1"))
    assert (out.status_code, out.json()["hold_usd"]) == (200, "0.1")
    # The other service posts a price of the model in force from a minute ago: $3 / $6.
    since = _ts(datetime.now(UTC) - timedelta(minutes=1))
    price(second, effective_from=since, input_usd_per_mtok="3", output_usd_per_mtok="6")
    out = first.post("/v1/authorizations", json=body("r2"))
    assert (out.status_code, out.json()["hold_usd"]) == (200, "0.3")
    # And a third, from the other service again: the copy follows each one.
    since = _ts(datetime.now(UTC) - timedelta(seconds=30))
    price(second, effective_from=since, input_usd_per_mtok="0.5", output_usd_per_mtok="1")
    out = first.post("/v1/authorizations", json=body("r3"))
    assert (out.status_code, out.json()["hold_usd"]) == (200, "0.05")
    # A repeated authorization keeps its first answer, at the price of its time.
    assert first.post("/v1/authorizations", json=body("r1")).json()["hold_usd"] == "0.1"


def test_a_price_posted_for_later_takes_effect_at_its_time_not_before(
    two: tuple[TestClient, TestClient],
) -> None:
    first, second = two
    price(first)
    assert auth_at(first, T0, rid="r1")["hold_usd"] == "0.1"
    later = T0 + timedelta(hours=1)
    price(second, effective_from=_ts(later), input_usd_per_mtok="2", output_usd_per_mtok="4")
    assert auth_at(first, later - timedelta(microseconds=1), rid="r2")["hold_usd"] == "0.1"
    assert auth_at(first, later, rid="r3")["hold_usd"] == "0.2"
    # A model without a price is unpriced until the other service prices it.
    other = {"input_tokens": 1_000_000, "max_output_tokens": 0}
    out = auth_at(first, later, rid="r4", model="m-other", estimate=other)
    assert (out["decision"], out["reason"], out["hold_usd"]) == ("allow", "unpriced", "0")
    price(second, model="m-other", input_usd_per_mtok="7")
    out = auth_at(first, later, rid="r5", model="m-other", estimate=other)
    assert (out["decision"], out["reason"], out["hold_usd"]) == ("allow", None, "7")


@pytest.mark.skipif(PG_URL is None, reason="two writers at once: PostgreSQL")
def test_a_price_committed_after_one_with_a_higher_id_is_still_seen(
    two: tuple[TestClient, TestClient],
) -> None:
    """Ids are drawn at insert and committed in any order: the copy of the prices loaded
    between the two commits holds the later id but not the earlier one, and is loaded again
    once the earlier one commits."""
    first, second = two
    price(first)
    assert auth_at(first, T0, rid="r1")["hold_usd"] == "0.1"
    slow = PriceIn.model_validate(
        {
            **PRICE,
            "effective_from": _ts(T0 - timedelta(minutes=1)),
            "input_usd_per_mtok": "4",
            "output_usd_per_mtok": "8",
        }
    )
    with write_transaction(state(second).sessions) as session:
        add_price(session, slow, T0)  # its id drawn first; not committed yet
        price(second, effective_from=_ts(T0 - timedelta(hours=1)), input_usd_per_mtok="2")
        # $2 / $2 from an hour ago is in force (the $4 / $8 one is not committed).
        assert auth_at(first, T0, rid="r2")["hold_usd"] == "0.15"
    assert auth_at(first, T0, rid="r3")["hold_usd"] == "0.4"
