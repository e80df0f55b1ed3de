"""Bringing a database to the migration head with Alembic, and checking that it is there."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

_PACKAGE = Path(__file__).resolve().parent.parent


def _migrations_dir() -> Path:
    """The Alembic scripts: ``billing/_migrations`` in an installed wheel (setup.py and
    ``package-dir`` in pyproject.toml map the repository's ``migrations/`` there), else the
    source tree's ``migrations/`` beside the package (a checkout run in place: ``pip install -e``
    or ``PYTHONPATH``)."""
    installed = _PACKAGE / "_migrations"
    return installed if installed.is_dir() else _PACKAGE.parent / "migrations"


#: Where the migrations are read from (see :func:`_migrations_dir`).
MIGRATIONS_DIR = _migrations_dir()


def alembic_config(database_url: str) -> Config:
    """An Alembic ``Config`` for ``database_url`` using the project's migrations."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade_to_head(database_url: str) -> None:
    """Apply every pending migration. Raises SQLAlchemy/Alembic errors if the database refuses."""
    command.upgrade(alembic_config(database_url), "head")


def head_revision() -> str | None:
    """The newest revision id in ``migrations/``."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return script.get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None for an empty database)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
