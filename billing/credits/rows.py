"""The row shapes that cross the credits' repository (``billing.credits.repository``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

#: The kinds of a credit entry (``CreditEntry.kind``).
GRANT = "grant"
DRAW = "draw"
REVERSAL = "reversal"
EXPIRY = "expiry"
OVERDRAFT = "overdraft"
VOID = "void"


class Owner(NamedTuple):
    """Who holds credit: a customer, or a key without a customer (exactly one set)."""

    customer_id: str | None
    api_key_id: str | None

    @classmethod
    def of(cls, customer_id: str | None, api_key_id: str | None) -> Owner:
        """The owner a call's ledger entry draws: its customer, else its key."""
        return cls(customer_id, None) if customer_id is not None else cls(None, api_key_id)

    def sort_key(self) -> tuple[str, str]:
        return (self.customer_id or "", self.api_key_id or "")

    def account(self) -> str:
        """The owner as one key (``CreditOverdraft.owner``): ``customer:<id>`` or ``key:<id>``."""
        if self.customer_id is not None:
            return f"customer:{self.customer_id}"
        return f"key:{self.api_key_id}"


class GrantView(NamedTuple):
    """A grant and what is left of it (picodollars), as the balance reads it."""

    grant_id: str
    owner: Owner
    amount_pusd: int
    remaining_pusd: int
    effective_at: datetime
    expires_at: datetime | None
    priority: int
    kind: str
    note: str | None
    voided: bool


class Movement(NamedTuple):
    """A credit entry to book (``CreditEntry`` without its id)."""

    kind: str
    booked_at: datetime
    owner: Owner
    grant_id: str | None
    amount_pusd: int
    request_id: str | None = None
    ledger_seq: int | None = None
    dedupe_key: str | None = None


#: A ``credit_entries`` row to insert: ``(kind, booked_at (the driver's value:
#: ``CreditsRepository.entry_time``), customer_id, api_key_id, grant_id, amount_pusd, request_id,
#: ledger_seq, dedupe_key)``.
EntryRow = tuple[
    str, Any, str | None, str | None, str | None, int, str | None, int | None, str | None
]

#: (call, owner) → grant id (None: the overdraft) → the net amount the call drew of it so far.
Drawn = dict[tuple[str, Owner], dict[str | None, int]]


class BalanceFigures(NamedTuple):
    """What an owner's balance reads (picodollars), in one statement: its live holds, the
    pending charges of its open calls, its overdraft and its grants (by ``grant_id``)."""

    held: int
    pending: int
    overdraft: int
    grants: list[GrantView]
