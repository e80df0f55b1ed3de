"""Chunks of rows from a raw DB-API cursor inside a session's transaction (both databases)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError


def fetch_chunks(
    connection: Connection,
    open_cursor: Callable[[Any], Any],
    statement: str,
    bound: Any,
    size: int,
) -> Iterator[list[Any]]:
    """The rows of ``statement`` (in the driver's own placeholders, bound to ``bound``), ``size``
    at a time, from the cursor ``open_cursor`` makes of the driver's connection; the cursor is
    closed when the rows end or the generator is closed. Driver errors are raised as
    SQLAlchemy's ``DBAPIError`` subclasses."""
    dbapi_error = connection.dialect.loaded_dbapi.Error
    try:
        cursor = open_cursor(connection.connection.driver_connection)
        try:
            cursor.execute(statement, bound)
            while rows := cursor.fetchmany(size):
                yield rows
        finally:
            cursor.close()
    except dbapi_error as error:
        raise DBAPIError.instance(statement, bound, error, dbapi_error) from error
