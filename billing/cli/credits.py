"""``billing credits grant|void|balance|list`` (CONTRACT "Prepaid credits (v3)")."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from sqlalchemy.orm import Session

from billing.cli.common import fail, invalid, load_settings, migrate_or_fail, open_sessions, problem
from billing.credits.rows import Owner
from billing.credits.schemas import GrantIn
from billing.credits.service import balance, entries_json, post_grant, void_grant
from billing.errors import BillingError
from billing.storage.db import read_transaction, write_transaction

credits_app = typer.Typer(help="Prepaid credits: grants, voids, balances.", no_args_is_help=True)

T = TypeVar("T")

Customer = Annotated[str | None, typer.Option("--customer", help="The customer.")]
Key = Annotated[str | None, typer.Option("--key", help="A key without a customer.")]


def _run(work: Callable[[Session], T], write: bool) -> T:
    settings = load_settings()
    migrate_or_fail(settings, create=write)
    transaction = write_transaction if write else read_transaction
    try:
        with transaction(open_sessions(settings)) as session:
            return work(session)
    except BillingError as error:
        fail(problem(error))


def _owner(customer: str | None, key: str | None) -> Owner:
    if (customer is None) == (key is None):
        fail("give exactly one of --customer and --key")
    return Owner(customer, key)


@credits_app.command("grant")
def credits_grant(
    grant_id: Annotated[str, typer.Argument(help="The grant's id (idempotent).")],
    amount: Annotated[str, typer.Option("--amount", help="USD, at most 6 decimal places.")],
    customer: Customer = None,
    key: Key = None,
    kind: Annotated[str, typer.Option("--kind", help="purchased or promotional.")] = "purchased",
    priority: Annotated[int, typer.Option("--priority", help="Lower is drawn first.")] = 100,
    effective_at: Annotated[
        str | None, typer.Option("--effective-at", help="RFC 3339 (default: now).")
    ] = None,
    expires_at: Annotated[str | None, typer.Option("--expires-at", help="RFC 3339.")] = None,
    note: Annotated[str | None, typer.Option("--note", help="Free text.")] = None,
) -> None:
    """Grant prepaid credit (as POST /v1/credits/grants); prints the grant as JSON."""
    fields: dict[str, Any] = {"grant_id": grant_id, "customer_id": customer, "api_key_id": key,
                              "amount_usd": amount, "kind": kind, "priority": priority,
                              "note": note, "expires_at": expires_at}  # fmt: skip
    if effective_at is not None:
        fields["effective_at"] = effective_at
    try:
        body = GrantIn.model_validate(fields)
    except ValidationError as error:
        fail(invalid(error, "grant"))
    answer, created = _run(lambda s: post_grant(s, body, datetime.now(UTC)), write=True)
    typer.echo(json.dumps(answer, indent=2))
    typer.echo(f"billing: grant {grant_id} {'stored' if created else 'unchanged'}", err=True)


@credits_app.command("void")
def credits_void(grant_id: Annotated[str, typer.Argument(help="The grant to end.")]) -> None:
    """End what is left of a grant (as POST /v1/credits/grants/{grant_id}/void)."""
    answer = _run(lambda s: void_grant(s, grant_id, datetime.now(UTC)), write=True)
    typer.echo(json.dumps(answer, indent=2))


@credits_app.command("balance")
def credits_balance(customer: Customer = None, key: Key = None) -> None:
    """The owner's balance as JSON (as GET /v1/credits/balance)."""
    owner = _owner(customer, key)
    typer.echo(json.dumps(_run(lambda s: balance(s, owner, datetime.now(UTC)), False), indent=2))


@credits_app.command("list")
def credits_list(
    customer: Customer = None,
    key: Key = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 100,
) -> None:
    """The owner's latest credit entries, newest first, under a header line: id, kind, booked
    at, grant, amount, call (tab separated, ``-`` for none)."""
    owner = _owner(customer, key)
    cells = ("kind", "booked_at", "grant_id", "amount_usd", "request_id")
    rows = _run(lambda s: entries_json(s, owner, limit, datetime.now(UTC)), write=False)
    typer.echo("\t".join(("entry_id", *cells)))
    for row in rows:
        typer.echo("\t".join([str(row["entry_id"]), *(str(row[c] or "-") for c in cells)]))
