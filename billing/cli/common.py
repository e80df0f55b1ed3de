"""What every ``billing`` command shares: one-line failures, the settings, the migration, the
database sessions and the ``billing`` loggers."""

from __future__ import annotations

import copy
import logging.config
from typing import Any, NoReturn

import typer
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from uvicorn.config import LOGGING_CONFIG

from billing.settings import Settings, SettingsError, get_settings
from billing.storage.db import make_engine, make_sessionmaker
from billing.storage.migrate import upgrade_to_head


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one clear line to standard error and exit non-zero."""
    typer.echo(f"billing: {message}", err=True)
    raise typer.Exit(code)


def load_settings() -> Settings:
    """The settings, or exit 2 with one line naming the bad setting."""
    try:
        return get_settings()
    except SettingsError as error:
        fail(str(error), 2)


def migrate_or_fail(settings: Settings) -> None:
    """Bring the database to the migration head, or exit 1 with one line saying why."""
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
