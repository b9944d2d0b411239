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
from typing import Any, Iterator, Mapping

import sqlite_utils

from labkit.errors import BadArgument, BadArgumentType, Busy, LabkitError, StaleGeneration

__all__ = [
    "connect",
    "transaction",
    "execute",
    "rowcount",
    "quote",
    "check_name",
    "check_db",
    "in_transaction",
    "ensure",
    "ensure_schema",
]

#: The message of the trigger :meth:`labkit.Fence.protect` installs; seeing it
#: means SQLite itself refused a token below the fence.
STALE_MESSAGE = "labkit: stale generation"
#: The message of the same trigger when the token column holds no integer.
NOT_INT_MESSAGE = "labkit: generation must be an integer"
NULL_JOB_MESSAGE = "labkit: job_id must not be NULL"
_MAX_TIMEOUT_MS = 2**31 - 1  # SQLite's busy timeout is a C int

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
        BadArgument: for a bad path or timeout, a file that is not SQLite, or
            a read-only database that lacks labkit's schema. A path starting
            with ``file:`` is an SQLite URI, e.g. ``"file:lab.db?mode=ro"``.
        Busy: when the schema cannot be installed within the busy timeout.

    Example:
        >>> db = connect()
        >>> db.conn.isolation_level is None
        True
    """
    path = check_name(os.fspath(path) if isinstance(path, os.PathLike) else path, "path")
    if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int):
        raise BadArgumentType(
            "busy_timeout_ms", f"must be an int, got {type(busy_timeout_ms).__name__}"
        )
    if not 0 <= busy_timeout_ms <= _MAX_TIMEOUT_MS:
        raise BadArgument(
            "busy_timeout_ms", f"must be in 0 .. {_MAX_TIMEOUT_MS}, got {busy_timeout_ms}"
        )
    try:
        conn = sqlite3.connect(
            path,
            isolation_level=None,
            timeout=busy_timeout_ms / 1000,
            check_same_thread=False,
            uri=path.startswith("file:"),
        )
    except sqlite3.Error as exc:
        raise BadArgument("path", f"cannot open {path!r}: {exc}") from None
    db = sqlite_utils.Database(conn)
    try:
        execute(db, "PRAGMA foreign_keys = ON")
        if (
            path != ":memory:"
            and "mode=memory" not in path
            and not path.startswith("file::memory:")
        ):
            if execute(db, "PRAGMA journal_mode")[0][0] != "wal":
                execute(db, "PRAGMA journal_mode = WAL")
        if not execute(db, "SELECT 1 FROM sqlite_master WHERE name = 'invoices'"):
            with transaction(db):
                for statement in filter(str.strip, SCHEMA.split(";")):
                    execute(db, statement)
    except BadArgument as exc:  # not SQLite, read-only without labkit's schema, ...
        conn.close()
        raise BadArgument("path", f"cannot use {path!r}: {str(exc).split(': ', 1)[-1]}") from None
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


def check_db(db, argument: str = "db") -> sqlite3.Connection:
    """Return the sqlite3 connection of ``db`` (a labkit database or a connection).

    Raises:
        BadArgumentType: ``db`` is neither, naming ``argument``.
        BadArgument: the connection opens transactions implicitly (its
            ``isolation_level`` is not None), e.g. ``sqlite_utils.Database("x.db")``.
    """
    conn = getattr(db, "conn", db)
    if not isinstance(conn, sqlite3.Connection):
        raise BadArgumentType(argument, f"must be a labkit database, got {type(db).__name__}")
    try:
        implicit = conn.isolation_level is not None
    except sqlite3.ProgrammingError:  # closed: the first statement says so
        return conn
    if implicit:
        raise BadArgument(
            argument,
            "the connection must have isolation_level=None, so that no "
            "implicit transaction surprises anyone: open it with labkit.connect()",
        )
    return conn


def _stale(conn: sqlite3.Connection, params: Any) -> StaleGeneration:
    """The trigger refused a row: say what we can know about it, read back now."""
    job = offered = current = None
    if isinstance(params, Mapping):
        job = params.get("job_id", params.get("job"))
        with contextlib.suppress(sqlite3.Error):
            for (column,) in conn.execute("SELECT column_name FROM labkit_protected"):
                if column in params:
                    offered = params[column]
                    break
    if isinstance(job, str):
        with contextlib.suppress(sqlite3.Error):
            row = conn.execute(
                "SELECT epoch, generation FROM job_fence WHERE job_id = ?", (job,)
            ).fetchone()
            if row is not None:
                current = row[1] if row[0] == 0 else tuple(row)
    return StaleGeneration(offered, current, job)


def _translate(exc: sqlite3.Error, conn: sqlite3.Connection, params: Any = ()) -> LabkitError:
    text = str(exc)
    if isinstance(exc, sqlite3.ProgrammingError) and "closed" in text:
        return BadArgument("db", "the database connection is closed")
    if STALE_MESSAGE in text:
        return _stale(conn, params)
    if NOT_INT_MESSAGE in text:
        return BadArgumentType("generation", "a fenced row's token must be an integer")
    if NULL_JOB_MESSAGE in text:
        return BadArgument("job_id", "a fenced row's job_id must not be NULL")
    if "locked" in text or "busy" in text:
        timeout_ms = None
        with contextlib.suppress(sqlite3.Error):
            timeout_ms = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        return Busy(timeout_ms)
    if "readonly" in text or "read-only" in text:
        return BadArgument("db", "the database is read-only")
    if "not a database" in text or "malformed" in text:
        return BadArgument("db", "the file is not a SQLite database")
    return LabkitError(f"SQLite error: {text}")


def execute(db, sql: str, params: Any = ()) -> list[tuple]:
    """Run one statement with bound ``params`` and return all its rows, fetched.

    Driver errors are translated into labkit errors here (and in :func:`rowcount`);
    this module is the only place labkit calls ``sqlite3``.

    Raises:
        BadArgumentType, BadArgument: ``sql`` is not one statement, or ``params``
            cannot be bound (wrong count or type, an int >= 2**63).
        StaleGeneration: a table protected by :meth:`labkit.Fence.protect` refused the row.
        Busy: the write lock stayed taken past the busy timeout.

    Example:
        >>> execute(connect(), "SELECT ? + 1", (41,))
        [(42,)]
    """
    return _run(db, sql, params)[0]


def rowcount(db, sql: str, params: Any = ()) -> int:
    """Run one write statement with bound ``params`` and return how many rows it changed.

    Raises the same errors as :func:`execute`.

    Example:
        >>> rowcount(connect(), "UPDATE job_fence SET generation = 1 WHERE job_id = ?", ("none",))
        0
    """
    return _run(db, sql, params)[1]


def _run(db, sql: str, params: Any) -> tuple[list[tuple], int]:
    conn = check_db(db)
    if not isinstance(sql, str):
        raise BadArgumentType("sql", f"must be a str, got {type(sql).__name__}")
    try:
        cursor = conn.execute(sql, params)
        try:
            return cursor.fetchall(), cursor.rowcount
        finally:
            cursor.close()
    except OverflowError as exc:
        raise BadArgument("params", f"{exc} (SQLite integers are below 2**63)") from None
    except sqlite3.ProgrammingError as exc:
        text = str(exc)
        if "one statement at a time" in text:
            raise BadArgument("sql", "must be exactly one statement") from None
        if "bind" in text or "supplied" in text or "parameters" in text:
            raise BadArgument("params", text) from None
        raise _translate(exc, conn, params) from exc
    except sqlite3.Error as exc:
        raise _translate(exc, conn, params) from exc


@contextlib.contextmanager
def transaction(db) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE``, then ``COMMIT`` on success or ``ROLLBACK`` on any exception.

    A protected table's refusal that reaches here as a bare ``sqlite3`` error
    (e.g. from a sqlite-utils insert inside the block) leaves as
    :class:`~labkit.StaleGeneration`, after the rollback.

    Raises:
        Busy: if the write lock is not free within the busy timeout (nothing ran).
        BadArgument: if the database is closed, or already inside a transaction.

    Example:
        >>> db = connect()
        >>> with transaction(db):
        ...     _ = execute(db, "INSERT INTO job_fence(job_id) VALUES ('job')")
        >>> execute(db, "SELECT job_id, generation FROM job_fence")
        [('job', 0)]
    """
    conn = check_db(db)
    if _in_transaction(conn):
        raise BadArgument("db", "a transaction is already open on this connection")
    execute(conn, "BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException as exc:
        with contextlib.suppress(sqlite3.Error, LabkitError):
            execute(conn, "ROLLBACK")
        if isinstance(exc, sqlite3.Error) and any(
            m in str(exc) for m in (STALE_MESSAGE, NOT_INT_MESSAGE, NULL_JOB_MESSAGE)
        ):
            raise _translate(exc, conn) from exc
        raise
    try:
        execute(conn, "COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error, LabkitError):
            execute(conn, "ROLLBACK")
        raise


def ensure(db, probe: str, probe_params: Any, statement: str, params: Any = ()) -> bool:
    """Run ``statement`` unless ``probe`` finds a row; return whether it ran.

    The common case (already there) is one read and never takes the write lock.
    Otherwise the statement runs in its own ``BEGIN IMMEDIATE``, after probing
    again under the lock, so two connections racing to install it do not
    collide. Inside a transaction already open on this connection it runs in
    that transaction instead (and rolls back with it).

    Example:
        >>> db = connect()
        >>> ensure(db, "SELECT 1 FROM job_fence WHERE job_id = ?", ("job",),
        ...        "INSERT INTO job_fence(job_id) VALUES (?)", ("job",))
        True
        >>> ensure(db, "SELECT 1 FROM job_fence WHERE job_id = ?", ("job",),
        ...        "INSERT INTO job_fence(job_id) VALUES (?)", ("job",))
        False
    """
    if execute(db, probe, probe_params):
        return False
    if in_transaction(db):
        execute(db, statement, params)
        return True
    with transaction(db):
        if execute(db, probe, probe_params):
            return False
        execute(db, statement, params)
        return True


def ensure_schema(db, table: str, ddl: str) -> bool:
    """Create ``table`` with the ``CREATE TABLE`` statement ``ddl`` unless it exists; return whether it did.

    See :func:`ensure`: a read when the table is there, else its own ``BEGIN IMMEDIATE``
    (or the caller's open transaction).

    Example:
        >>> db = connect()
        >>> ensure_schema(db, "notes", "CREATE TABLE notes (text TEXT)"), \\
        ...     ensure_schema(db, "notes", "CREATE TABLE notes (text TEXT)")
        (True, False)
    """
    return ensure(
        db,
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
        (check_name(table, "table"),),
        ddl,
    )


def in_transaction(db) -> bool:
    """Whether a transaction is open on ``db``'s connection.

    Raises:
        BadArgument: the connection is closed.
    """
    return _in_transaction(check_db(db))


def _in_transaction(conn: sqlite3.Connection) -> bool:
    try:
        return conn.in_transaction
    except sqlite3.ProgrammingError:
        raise BadArgument("db", "the database connection is closed") from None
