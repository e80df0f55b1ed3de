"""``billing budgets``: create, update, delete, list and show budgets (as ``/v1/budgets``,
CONTRACT "Budgets and alerts (v2)"); answers are printed as JSON on stdout."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from billing import destinations
from billing.budgets import service
from billing.budgets.schemas import BudgetChange, BudgetIn
from billing.cli.common import fail, load_settings, migrate_or_fail, open_sessions
from billing.errors import BillingError
from billing.storage.db import read_transaction, write_transaction

budgets_app = typer.Typer(
    help="Budgets over a key, a customer, a tag or every call.", no_args_is_help=True
)

KeyOpt = Annotated[str | None, typer.Option("--api-key-id", help="The budget is over this key.")]
CustomerOpt = Annotated[
    str | None, typer.Option("--customer-id", help="The budget is over this customer's keys.")
]
LimitOpt = Annotated[str, typer.Option("--limit-usd", help="USD, a positive decimal.")]
PeriodOpt = Annotated[
    str, typer.Option(help="day, week (from Monday), month, total or rolling (--window-s).")
]
TagOpt = Annotated[str | None, typer.Option("--tag", help="The budget is over this tag's calls.")]
AllOpt = Annotated[bool, typer.Option("--all", help="The budget is over every call.")]
ModelOpt = Annotated[
    str | None, typer.Option("--model", help='Count only this model, or a prefix: "claude-*".')
]
WindowOpt = Annotated[
    int | None, typer.Option("--window-s", help="A rolling period's window, 60–2592000 s.")
]
UnpricedOpt = Annotated[
    str, typer.Option(help="What an authorization of an unpriced model gets: allow or deny.")
]
MeasureOpt = Annotated[str, typer.Option(help="charge (default) or cost.")]
TzOpt = Annotated[str, typer.Option(help="IANA time zone of the calendar.")]
ThresholdsOpt = Annotated[
    str, typer.Option(help="Fractions of the limit, comma-separated, ascending.")
]
UrlOpt = Annotated[str | None, typer.Option("--webhook-url", help="http(s) URL for alerts.")]


def _body(
    key: str | None,
    customer: str | None,
    limit: str,
    period: str,
    measure: str,
    tz: str,
    thresholds: str,
    url: str | None,
    v3: dict[str, Any],
) -> dict[str, Any]:
    """The budget's JSON body from the options (``v3``: tag, all, model, window_s, unpriced)."""
    scope: dict[str, Any] = {"api_key_id": key} if key is not None else {}
    if customer is not None:
        scope["customer_id"] = customer
    if v3["tag"] is not None:
        scope["tag"] = v3["tag"]
    if v3["all"]:
        scope["all"] = True
    return {
        "scope": scope,
        "limit_usd": limit,
        "period": period,
        "window_s": v3["window_s"],
        "model": v3["model"],
        "unpriced": v3["unpriced"],
        "measure": measure,
        "tz": tz,
        "thresholds": [t.strip() for t in thresholds.split(",") if t.strip()],
        "webhook_url": url,
    }


def _validated(model: type[BudgetChange], body: dict[str, Any]) -> Any:
    try:
        with destinations.allowing_private(load_settings().webhook_allow_private):
            return model.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "budget"
        fail(f"{where}: {first['msg']}", 2)


def _run(work: Any, write: bool = True) -> Any:
    settings = load_settings()
    migrate_or_fail(settings, create=write)
    transaction = write_transaction if write else read_transaction
    try:
        with transaction(open_sessions(settings)) as session:
            return work(session, datetime.now(UTC))
    except BillingError as error:
        fail(str(error))


def _print(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2))


@budgets_app.command("create")
def budgets_create(
    budget_id: Annotated[str, typer.Argument(help="The new budget's id.")],
    limit_usd: LimitOpt,
    period: PeriodOpt,
    api_key_id: KeyOpt = None,
    customer_id: CustomerOpt = None,
    measure: MeasureOpt = "charge",
    tz: TzOpt = "UTC",
    thresholds: ThresholdsOpt = "0.8,1",
    webhook_url: UrlOpt = None,
    tag: TagOpt = None,
    all_calls: AllOpt = False,
    model: ModelOpt = None,
    window_s: WindowOpt = None,
    unpriced: UnpricedOpt = "allow",
) -> None:
    """Create a budget; prints it with its webhook_secret (shown this once)."""
    v3 = {"tag": tag, "all": all_calls, "model": model, "window_s": window_s, "unpriced": unpriced}
    body = _body(
        api_key_id, customer_id, limit_usd, period, measure, tz, thresholds, webhook_url, v3
    )
    parsed = _validated(BudgetIn, {"budget_id": budget_id, **body})
    _print(_run(lambda s, now: service.create_budget(s, parsed, now)))


@budgets_app.command("update")
def budgets_update(
    budget_id: Annotated[str, typer.Argument(help="The budget to change.")],
    limit_usd: LimitOpt,
    period: PeriodOpt,
    api_key_id: KeyOpt = None,
    customer_id: CustomerOpt = None,
    measure: MeasureOpt = "charge",
    tz: TzOpt = "UTC",
    thresholds: ThresholdsOpt = "0.8,1",
    webhook_url: UrlOpt = None,
    tag: TagOpt = None,
    all_calls: AllOpt = False,
    model: ModelOpt = None,
    window_s: WindowOpt = None,
    unpriced: UnpricedOpt = "allow",
) -> None:
    """Replace a budget's definition (a new version; the history stays)."""
    v3 = {"tag": tag, "all": all_calls, "model": model, "window_s": window_s, "unpriced": unpriced}
    body = _body(
        api_key_id, customer_id, limit_usd, period, measure, tz, thresholds, webhook_url, v3
    )
    parsed = _validated(BudgetChange, body)
    _print(_run(lambda s, now: service.update_budget(s, budget_id, parsed, now)))


@budgets_app.command("delete")
def budgets_delete(budget_id: Annotated[str, typer.Argument(help="The budget to end.")]) -> None:
    """End a budget (its history stays)."""
    _print(_run(lambda s, now: service.delete_budget(s, budget_id, now)))


@budgets_app.command("list")
def budgets_list(
    include_ended: Annotated[bool, typer.Option(help="Also the deleted ones.")] = False,
) -> None:
    """The budgets in force, by id."""
    _print(_run(lambda s, now: service.list_budgets(s, include_ended), write=False))


@budgets_app.command("show")
def budgets_show(budget_id: Annotated[str, typer.Argument(help="The budget.")]) -> None:
    """A budget's spend in its current period (as GET /v1/budgets/{budget_id})."""
    _print(_run(lambda s, now: service.budget_status(s, budget_id, now), write=False))
