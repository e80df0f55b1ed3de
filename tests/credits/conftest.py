"""Every credits test ends with the kept remainders and overdrafts equal to the sums of the
credit entries that prove them (``tests.credits.helpers.kept_sums``), whatever it booked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.credits.helpers import kept_sums


@pytest.fixture(autouse=True)
def _sums_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    url = request.getfixturevalue("db_url") if "db_url" in request.fixturenames else None
    yield
    if url is not None:
        kept_sums(url)
