"""The columns both databases' export statements read, derived once from the dimensions and
the rates (the v1 exports' columns; a v2 export adds ledger columns by name)."""

from __future__ import annotations

from collections.abc import Sequence

from billing.dimensions import V1_TOKEN_FIELDS
from billing.rates import V1_RATES

#: The token columns of the v1 exports, and as decimal text (the database writes integers faster
#: than Python does).
EXPORT_TOKENS = ", ".join(V1_TOKEN_FIELDS)
TOKENS_AS_TEXT = ", ".join(f"CAST({name} AS TEXT)" for name in V1_TOKEN_FIELDS)
#: The sums of the v1 exports' token columns.
EXPORT_TOKEN_SUMS = ", ".join(f"sum({name})" for name in V1_TOKEN_FIELDS)
#: The ledger's price columns of the v1 exports (micro-USD per million tokens), in the order of
#: the CSV's.
LEDGER_PRICES = ", ".join(r.column for r in V1_RATES)


def extra_columns(sources: Sequence[str]) -> str:
    """``, a, b`` for the ledger columns ``sources`` a v2 export adds (empty for none)."""
    return "".join(f", {name}" for name in sources)
