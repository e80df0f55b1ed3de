"""Lists in SQL: how many request ids go in one statement, SQLite's ``?`` lists, and a list
bound as one parameter (``Listed``: a JSON array on SQLite, an array on PostgreSQL)."""

from __future__ import annotations

import functools
from typing import Any, Protocol

import orjson
from sqlalchemy import ColumnElement, Select, String, any_, bindparam, func, literal_column, select
from sqlalchemy.dialects import postgresql

#: Ids per statement on SQLite (``with_ids``; SQLite allows 32,766 parameters a statement).
CHUNK = 4000


@functools.lru_cache(maxsize=64)
def with_ids(statement: str, count: int) -> str:
    """``statement`` with its ``{ids}`` list of ``count`` parameters (one per request id)."""
    return statement.replace("{ids}", ", ".join("?" * count))


class Listed(Protocol):
    """A condition that ``column`` is one of the list bound as ``name``, with one parameter
    however long the list, and the list as that parameter's value (``value``). An expanding
    ``IN`` renders a bound value each, SQLAlchemy's and psycopg's work: 5-10 ms of CPU at 500
    values."""

    def __call__(self, column: Any, name: str) -> ColumnElement[bool]: ...

    def value(self, values: list[str]) -> Any: ...


class _JsonList:
    """SQLite: the list bound as one JSON array, read by ``json_each``."""

    def __call__(self, column: Any, name: str) -> ColumnElement[bool]:
        values: Select[Any] = select(literal_column("value")).select_from(
            func.json_each(bindparam(name))
        )
        return column.in_(values)  # type: ignore[no-any-return]

    def value(self, values: list[str]) -> Any:
        return orjson.dumps(values).decode()


class _ArrayList:
    """PostgreSQL: the list bound as one ``text[]``, ``= ANY``."""

    def __call__(self, column: Any, name: str) -> ColumnElement[bool]:
        return column == any_(bindparam(name, type_=postgresql.ARRAY(String)))  # type: ignore[no-any-return]

    def value(self, values: list[str]) -> Any:
        return values


JSON_LIST: Listed = _JsonList()
ARRAY_LIST: Listed = _ArrayList()
