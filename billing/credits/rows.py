"""The row shapes that cross the credits' repository (``billing.credits.repository``)."""

from __future__ import annotations

from datetime import datetime
from operator import itemgetter
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
    #: The call's ``calls.call_no`` (with ``request_id``).
    call_no: int | None = None


#: A ``credit_entries`` row to insert: ``(kind, booked_at (the driver's value:
#: ``CreditsRepository.entry_time``), customer_id, api_key_id, grant_id, amount_pusd, request_id,
#: ledger_seq, dedupe_key, call_no)``.
EntryRow = tuple[
    str, Any, str | None, str | None, str | None, int, str | None, int | None, str | None,
    int | None,
]  # fmt: skip

#: (call, owner) → grant id (None: the overdraft) → the net amount the call drew of it so far.
Drawn = dict[tuple[str, Owner], dict[str | None, int]]


class DueExpiry(NamedTuple):
    """A grant expired whose expiry is not booked yet (``CreditsRepository.due_expiries``)."""

    grant_id: str
    owner: Owner
    expires_at: datetime
    created_at: datetime


class BalanceFigures(NamedTuple):
    """What an owner's balance reads (picodollars), in one statement: its live holds, the
    pending charges of its open calls, its overdraft and its grants (by ``grant_id``)."""

    held: int
    pending: int
    overdraft: int
    grants: list[GrantView]


class CommonDraws(NamedTuple):
    """The fast path's calls of a step that each draw their whole charge from their key's first
    grant in order (``billing.credits.draws``): booked as one ``draw`` each of the call's
    settlement entry (seq 1), given by key rather than row by row."""

    #: The booking time as the repository takes it (``CreditsRepository.entry_time``).
    at: Any
    #: ``(request_id, api_key_id, charge_pusd, call_no)`` of the fast path's calls, by
    #: ``request_id`` (``billing.reconcile.rows.CommonCharge``); those of keys not in ``grants``
    #: are not these draws, nor is a charge of 0.
    calls: list[tuple[str, str, int, int]]
    #: Key → the grant its calls draw.
    grants: dict[str, str]
    #: How many draws (the rows they make): ``calls`` of a key in ``grants`` with a charge above 0.
    drawn: int

    def rows(self) -> list[EntryRow]:
        """The draws as entry rows, by ``request_id``."""
        at, grants = self.at, self.grants
        return [
            (DRAW, at, None, key, grants[key], charge, rid, 1, None, call_no)
            for rid, key, charge, call_no in self.calls
            if charge > 0 and key in grants
        ]

    def merged(self, rows: list[EntryRow]) -> list[EntryRow]:
        """These draws and ``rows`` (of other calls, in the order drawn: by ``request_id``) as one
        list by ``request_id``, the order a step draws in."""
        if not self.grants:
            return rows
        mine = self.rows()
        if not rows:
            return mine
        # Two runs by request_id, no call in both: one merge (a stable sort keeps each call's
        # rows in the order drawn).
        return sorted(rows + mine, key=_REQUEST_ID)


_REQUEST_ID = itemgetter(6)
