"""What every ``billing`` command shares: one-line failures, the settings, the migration, the
database sessions, loading a file of API objects and the ``billing`` loggers."""

from __future__ import annotations

import copy
import json
import logging.config
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from uvicorn.config import LOGGING_CONFIG

from billing.errors import BillingError, ValidationFailed
from billing.ingest.validation import plain_message
from billing.settings import Settings, SettingsError, get_settings
from billing.storage.db import make_engine, make_sessionmaker, write_transaction
from billing.storage.disk import sqlite_path
from billing.storage.migrate import upgrade_to_head

M = TypeVar("M", bound=BaseModel)


#: How the service's messages write a ``+`` for a query string, and what a command line takes.
_QUERY_PLUS = (" (a + in a query string is written %2B)", "%2B")


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one clear line to standard error and exit non-zero. A message written for a query
    string (the service's own validation: "…%2B05:30 (a + in a query string is written %2B)")
    is given as a command line takes it: ``+``."""
    note, escaped = _QUERY_PLUS
    message = message.replace(note, "").replace(escaped, "+")
    typer.echo(f"billing: {message}", err=True)
    raise typer.Exit(code)


def load_settings() -> Settings:
    """The settings, or exit 2 with one line naming the bad setting."""
    try:
        return get_settings()
    except SettingsError as error:
        fail(str(error), 2)


def migrate_or_fail(settings: Settings, *, create: bool = True) -> None:
    """Bring the database to the migration head, or exit 1 with one line saying why. A command
    that only reads (``create=False``) does not make a SQLite file that is not there: it exits
    1 naming the file (run from another directory, it would list an empty new database)."""
    path = sqlite_path(settings.database_url)
    if not create and path is not None and not Path(path).exists():
        fail(
            f"no database at {Path(path).resolve()}: run the command where `billing serve` keeps "
            "its billing.db, or set BILLING_DATABASE_URL"
        )
    try:
        upgrade_to_head(settings.database_url)
    except SQLAlchemyError as error:
        reason = str(getattr(error, "orig", error)).strip().splitlines()[0]
        fail(f"cannot migrate the database at {safe_url(settings.database_url)}: {reason}")


def safe_url(url: str) -> str:
    """The URL without a password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}@{host}"
    return url


def open_sessions(settings: Settings) -> sessionmaker[Session]:
    """A session factory on the configured database."""
    return make_sessionmaker(make_engine(settings))


def problem(error: BillingError) -> str:
    """One line for a domain error: a validation error's first problem (``path: message``),
    else the error's text."""
    if isinstance(error, ValidationFailed) and error.errors:
        first = error.errors[0]
        return f"{first.path}: {first.message}"
    return str(error)


def invalid(error: ValidationError, what: str) -> str:
    """One line for pydantic's first problem with a ``what`` (``"price input_usd_per_mtok:
    Input should be …"``; ``"price: …"`` for a problem with the whole object)."""
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    # The service's own sentence, as the API's 422 gives it (no "Value error, " in front).
    return f"{what}{' ' + where if where else ''}: {plain_message(first)}"


def read_objects(file: Path, model: type[M], what: str) -> list[M]:
    """The objects of ``file``, a JSON list of ``what`` objects, each validated as ``model``;
    exits 1 with one line naming the file and its first problem."""
    try:
        document = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        fail(f"cannot read {file}: {error}")
    if not isinstance(document, list):
        fail(f"{file} must hold a JSON list of {what} objects")
    try:
        return [model.model_validate(item) for item in document]
    except ValidationError as error:
        fail(f"{file}: {invalid(error, what)}")


def store_objects(
    settings: Settings, items: Sequence[M], add: Callable[[Session, M, datetime], tuple[Any, bool]]
) -> int:
    """Store ``items`` in one transaction, each with ``add`` (which answers ``(row, created)``),
    after migrating the database; returns how many were created. Exits 1 with one line on a
    domain error (nothing is stored then)."""
    migrate_or_fail(settings)
    created = 0
    try:
        with write_transaction(open_sessions(settings)) as session:
            now = datetime.now(UTC)
            for item in items:
                created += add(session, item, now)[1]
    except BillingError as error:
        fail(problem(error))
    return created


def log_config(log_level: str) -> dict[str, Any]:
    """uvicorn's logging configuration plus the ``billing`` loggers at ``log_level``, on stderr
    with time, level and logger name (without it, Python shows only their warnings)."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["billing"] = {
        "format": "%(asctime)s %(levelname)s %(name)s: %(message)s",
    }
    config["handlers"]["billing"] = {
        "class": "logging.StreamHandler",
        "formatter": "billing",
        "stream": "ext://sys.stderr",
    }
    config["loggers"]["billing"] = {
        "handlers": ["billing"],
        "level": log_level.upper(),
        "propagate": False,
    }
    return config


def configure_logging(log_level: str) -> None:
    """Send the ``billing`` loggers to stderr at ``log_level`` (commands run without uvicorn)."""
    logging.config.dictConfig(log_config(log_level))
