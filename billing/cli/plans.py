"""``billing keys set|list`` and ``billing plans load FILE`` (CONTRACT "Keys, customers and plans
(v2)", "Command line")."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from billing.cli.common import (
    fail,
    invalid,
    load_settings,
    migrate_or_fail,
    open_sessions,
    problem,
    read_objects,
    store_objects,
)
from billing.errors import BillingError
from billing.plans.schemas import KeyIn, PlanIn
from billing.plans.service import add_plan, list_keys, set_key
from billing.storage.db import read_transaction, write_transaction

keys_app = typer.Typer(help="Api keys: their customer, plan and name.", no_args_is_help=True)
plans_app = typer.Typer(help="Plans: markup and own prices.", no_args_is_help=True)


@keys_app.command("set")
def keys_set(
    api_key_id: Annotated[str, typer.Argument(help="The key's public id (key_7f3a).")],
    customer: Annotated[str | None, typer.Option("--customer", help="Its customer.")] = None,
    plan: Annotated[str | None, typer.Option("--plan", help="Its plan (posted before).")] = None,
    name: Annotated[str | None, typer.Option("--name", help="A name for people.")] = None,
    effective_from: Annotated[
        str | None,
        typer.Option("--effective-from", help="RFC 3339 with an offset (default: now)."),
    ] = None,
) -> None:
    """Set the key's customer, plan and name from a time on (as PUT /v1/keys/{api_key_id});
    calls settled since then are re-rated by the next reconciliation."""
    settings = load_settings()
    fields = {"customer_id": customer, "plan_id": plan, "name": name}
    if effective_from is not None:
        fields["effective_from"] = effective_from
    try:
        body = KeyIn.model_validate(fields)
    except ValidationError as error:
        fail(invalid(error, "key"))
    migrate_or_fail(settings)
    try:
        with write_transaction(open_sessions(settings)) as session:
            _, created = set_key(session, api_key_id, body, datetime.now(UTC))
    except BillingError as error:
        fail(problem(error))
    typer.echo(f"billing: key {api_key_id} {'set' if created else 'unchanged'}", err=True)


@keys_app.command("list")
def keys_list() -> None:
    """List the keys with an assignment: id, customer, plan, name and since when (tab
    separated, ``-`` for none), by id."""
    settings = load_settings()
    migrate_or_fail(settings, create=False)
    now = datetime.now(UTC)
    after = None
    with read_transaction(open_sessions(settings)) as session:
        while True:
            page, cursor = list_keys(session, after, 1000, now)
            for key in page:
                cells = ("customer_id", "plan_id", "name", "effective_from")
                typer.echo("\t".join([key["api_key_id"], *(key[c] or "-" for c in cells)]))
            if cursor is None:
                break
            after = page[-1]["api_key_id"]


@plans_app.command("load")
def plans_load(
    file: Annotated[Path, typer.Argument(help="A JSON list of plans (as POST /v1/plans).")],
) -> None:
    """Load plan versions from FILE; an identical stored version is skipped, a different one
    fails (nothing of the file is stored then)."""
    settings = load_settings()
    plans = read_objects(file, PlanIn, "plan")
    created = store_objects(settings, plans, add_plan)
    present = len(plans) - created
    typer.echo(f"billing: {created} plan version(s) added, {present} already present", err=True)
