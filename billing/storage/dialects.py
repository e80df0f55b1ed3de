"""One implementation per database, chosen by the database behind a session: each room's
``repository(session)`` factory holds its SQLite and PostgreSQL classes in a ``ByDialect``.

This is the one place that reads a database's dialect name; domain code asks its room's factory
and never which database it runs on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

T = TypeVar("T")


class DialectInsert(Protocol):
    """A database's own ``INSERT`` construct (``sqlalchemy.dialects.sqlite.insert``,
    ``…postgresql.insert``): the one with ``on_conflict_do_nothing`` and ``…_do_update``, given to
    the classes both databases share."""

    def __call__(self, table: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class ByDialect(Generic[T]):
    """A value per database: ``sqlite`` and ``postgresql`` (SQLAlchemy's dialect names).

    Annotated as ``ByDialect[SomeRepository]``, it makes the type checker prove that both
    classes implement the room's ``Protocol``: a missing or misnamed method fails ``mypy``.
    """

    sqlite: T
    postgresql: T

    def of(self, bind: Session | Connection | Engine) -> T:
        """The value for the database behind ``bind``; ``ValueError`` for a database that is
        neither SQLite nor PostgreSQL."""
        engine = bind.get_bind() if isinstance(bind, Session) else bind
        name = engine.dialect.name
        if name == "sqlite":
            return self.sqlite
        if name == "postgresql":
            return self.postgresql
        raise ValueError(f"no implementation for the database {name!r}: use SQLite or PostgreSQL")
