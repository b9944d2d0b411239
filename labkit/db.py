"""The one place labkit talks to SQLite.

The transaction contract, once: every connection labkit opens has
``isolation_level=None``, so Python never opens a transaction behind our back.
A write that matters runs inside :func:`transaction`, which issues
``BEGIN IMMEDIATE`` (taking the write lock up front, so two writers never
both read and then collide), then ``COMMIT`` if the block finishes or
``ROLLBACK`` if it raises. Every statement goes through :func:`execute`, which
binds all values and fetches every row before returning, so no ``RETURNING``
cursor is ever left open at ``COMMIT``. Whether an operation won is answered by
the row count of one conditional statement, never by a read followed by a write.
Driver errors become labkit errors here and nowhere else.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from typing import Any, Iterator

import sqlite_utils

from .errors import BadArgument, BadArgumentType, Busy, LabkitError

__all__ = ["connect", "transaction", "execute", "rowcount", "quote", "check_name"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS lease_counter (
    name TEXT PRIMARY KEY,
    generation INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    generation INTEGER NOT NULL,
    expires_at REAL NOT NULL,
    ttl REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS job_fence (
    job_id TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL DEFAULT 0,
    generation INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    payload TEXT,
    result TEXT
);
CREATE TABLE IF NOT EXISTS invoices (
    job_id TEXT NOT NULL,
    invoice_id TEXT NOT NULL,
    amount INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    PRIMARY KEY (job_id, invoice_id)
);
"""


def connect(path: str = ":memory:", *, busy_timeout_ms: int = 5000) -> sqlite_utils.Database:
    """Open a SQLite database for labkit and install labkit's schema.

    File databases use WAL (readers never block writers), foreign keys are on,
    and the connection is in explicit transaction control (``isolation_level=None``).

    Args:
        path: a file path, or ``":memory:"``.
        busy_timeout_ms: how long a writer waits for the write lock before
            :class:`~labkit.Busy`. Simulated workers use 0: never block.

    Returns:
        A ``sqlite_utils.Database`` wrapping the connection.

    Raises:
        BadArgument: for a bad path or timeout, or a file that is not SQLite.
        Busy: when the schema cannot be installed within the busy timeout.

    Example:
        >>> db = connect()
        >>> db.conn.isolation_level is None
        True
    """
    path = check_name(os.fspath(path) if isinstance(path, os.PathLike) else path, "path")
    if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int):
        raise BadArgumentType("busy_timeout_ms", f"must be an int, got {type(busy_timeout_ms).__name__}")
    if busy_timeout_ms < 0:
        raise BadArgument("busy_timeout_ms", f"must be >= 0, got {busy_timeout_ms}")
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout_ms / 1000,
                               check_same_thread=False)
    except sqlite3.Error as exc:
        raise BadArgument("path", f"cannot open {path!r}: {exc}") from None
    db = sqlite_utils.Database(conn)
    try:
        execute(db, "PRAGMA foreign_keys = ON")
        if path != ":memory:" and not path.startswith("file::memory:"):
            if execute(db, "PRAGMA journal_mode")[0][0] != "wal":
                execute(db, "PRAGMA journal_mode = WAL")
        if not execute(db, "SELECT 1 FROM sqlite_master WHERE name = 'invoices'"):
            with transaction(db):
                for statement in filter(str.strip, SCHEMA.split(";")):
                    execute(db, statement)
    except BaseException:
        conn.close()
        raise
    return db


def check_name(value: Any, argument: str) -> str:
    """Return ``value`` if it is a non-empty str, else raise naming ``argument``."""
    if not isinstance(value, str):
        raise BadArgumentType(argument, f"must be a str, got {type(value).__name__}")
    if not value:
        raise BadArgument(argument, "must not be empty")
    if "\x00" in value:
        raise BadArgument(argument, "must not contain NUL characters")
    return value


def quote(identifier: str) -> str:
    """Quote an SQL identifier (a table or column name) the one way labkit does."""
    check_name(identifier, "identifier")
    return '"' + identifier.replace('"', '""') + '"'


def _conn(db) -> sqlite3.Connection:
    conn = getattr(db, "conn", db)
    if not isinstance(conn, sqlite3.Connection):
        raise BadArgumentType("db", f"must be a labkit database, got {type(db).__name__}")
    return conn


def _translate(exc: sqlite3.Error, conn: sqlite3.Connection) -> LabkitError:
    text = str(exc)
    if isinstance(exc, sqlite3.ProgrammingError) and "closed" in text:
        return BadArgument("db", "the database connection is closed")
    if "locked" in text or "busy" in text:
        return Busy()
    if "readonly" in text or "read-only" in text:
        return BadArgument("db", "the database is read-only")
    if "not a database" in text or "malformed" in text:
        return BadArgument("db", "the file is not a SQLite database")
    return LabkitError(f"SQLite error: {text}")


def execute(db, sql: str, params: Any = ()) -> list[tuple]:
    """Run one statement with bound ``params`` and return all its rows, fetched.

    Driver errors are translated into labkit errors. This is the only function
    in labkit that calls ``sqlite3`` directly.
    """
    conn = _conn(db)
    try:
        cursor = conn.execute(sql, params)
        try:
            return cursor.fetchall()
        finally:
            cursor.close()
    except sqlite3.Error as exc:
        raise _translate(exc, conn) from exc


def rowcount(db, sql: str, params: Any = ()) -> int:
    """Run one write statement with bound ``params`` and return how many rows it changed."""
    conn = _conn(db)
    try:
        cursor = conn.execute(sql, params)
        try:
            cursor.fetchall()
            return cursor.rowcount
        finally:
            cursor.close()
    except sqlite3.Error as exc:
        raise _translate(exc, conn) from exc


@contextlib.contextmanager
def transaction(db) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE``, then ``COMMIT`` on success or ``ROLLBACK`` on any exception.

    Raises:
        Busy: if the write lock is not free within the busy timeout (nothing ran).
        BadArgument: if the database is closed, or already inside a transaction.
    """
    conn = _conn(db)
    if _in_transaction(conn):
        raise BadArgument("db", "a transaction is already open on this connection")
    execute(conn, "BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        with contextlib.suppress(sqlite3.Error, LabkitError):
            execute(conn, "ROLLBACK")
        raise
    try:
        execute(conn, "COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error, LabkitError):
            execute(conn, "ROLLBACK")
        raise


def _in_transaction(conn: sqlite3.Connection) -> bool:
    try:
        return conn.in_transaction
    except sqlite3.ProgrammingError:
        raise BadArgument("db", "the database connection is closed") from None
