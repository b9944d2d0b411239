"""The one place labkit talks to SQLite, and its one seam to other databases (:class:`Engine`).

The transaction contract, once: every connection labkit opens has ``isolation_level=None``, so
Python never opens a transaction behind our back. A write that matters runs inside
:func:`transaction`: ``BEGIN IMMEDIATE`` (taking the write lock up front, so two writers never
both read and then collide), then ``COMMIT`` if the block finishes or ``ROLLBACK`` if it raises.
:func:`execute` binds all values and fetches every row, so no ``RETURNING`` cursor is open at
``COMMIT``; its placeholders are ``$1, $2, ...``, PostgreSQL's own and parameters named 1, 2,
... to SQLite, so no engine rewrites a statement (SQLite's ``?`` works here too). Whether an
operation won is the row count of one conditional statement. Driver errors become labkit
errors here, or in an engine's handle.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sqlite3
from collections.abc import Mapping, Sequence  # not typing's: its isinstance is Python code
from typing import TYPE_CHECKING, Any, Iterator

from labkit.errors import BadArgument, BadArgumentType, Busy, LabkitError, StaleGeneration
from labkit.errors import check_number

if TYPE_CHECKING:
    import sqlite_utils

__all__ = ["connect", "transaction", "execute", "rowcount", "in_transaction", "check_db"]
__all__ += ["check_name", "quote", "ensure", "ensure_schema"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS lease_counter (name TEXT PRIMARY KEY, generation INTEGER NOT NULL)
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY, owner TEXT NOT NULL, generation INTEGER NOT NULL,
    expires_at REAL NOT NULL, ttl REAL NOT NULL);
CREATE TABLE IF NOT EXISTS job_fence (job_id TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL DEFAULT 0, generation INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotency_keys (key TEXT PRIMARY KEY, payload TEXT, result TEXT);
CREATE TABLE IF NOT EXISTS invoices (
    job_id TEXT NOT NULL, invoice_id TEXT NOT NULL, amount INTEGER NOT NULL,
    generation INTEGER NOT NULL, PRIMARY KEY (job_id, invoice_id));
"""


class Engine:
    """A database other than SQLite behind this seam: labkit.engines.postgres_db has one."""


def connect(path: str = ":memory:", *, busy_timeout_ms: int = 5000) -> sqlite_utils.Database:
    """Open a SQLite database (WAL, ``isolation_level=None``) and install labkit's schema.

    A writer waits ``busy_timeout_ms`` for the lock, then raises Busy; ``file:...`` is a URI.

    >>> execute(connect(), "SELECT $1 + 1", (41,))
    [(42,)]
    """
    path = check_name(os.fspath(path) if isinstance(path, os.PathLike) else path, "path")
    timeout = check_number(busy_timeout_ms, "busy_timeout_ms", integer=True, high=2**31 - 1)
    try:
        options = {"timeout": timeout / 1000, "uri": path.startswith("file:")}
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, **options)
    except sqlite3.Error as exc:
        raise BadArgument("path", f"cannot open {path!r}: {exc}") from None
    import sqlite_utils  # here, not at the top: it loads numpy, which `import labkit` must not

    db = sqlite_utils.Database(conn)
    try:
        execute(db, "PRAGMA foreign_keys = ON")
        if execute(db, "PRAGMA journal_mode")[0][0] != "wal":  # a memory database stays "memory"
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
    """Return ``value`` if it is a non-empty str without NUL, else raise naming ``argument``."""
    if not isinstance(value, str):
        raise BadArgumentType(argument, f"must be a str, got {type(value).__name__}")
    if not value or "\x00" in value:
        raise BadArgument(argument, "must be a non-empty str without NUL characters")
    return value


def quote(identifier: str) -> str:
    """Quote an SQL identifier (a table or column name) the one way labkit does."""
    return '"' + check_name(identifier, "identifier").replace('"', '""') + '"'


def check_db(db, argument: str = "db") -> sqlite3.Connection:
    """Return the connection of ``db`` (a labkit database, or an explicit-mode sqlite3 one)."""
    conn = getattr(db, "conn", db)  # a sqlite-utils Database, a Tx, or the connection itself
    if not isinstance(conn, (sqlite3.Connection, Engine)):
        raise BadArgumentType(argument, f"must be a labkit database, got {type(db).__name__}")
    with contextlib.suppress(sqlite3.ProgrammingError):  # closed: the first statement says so
        if conn.isolation_level is not None:  # Python would open transactions behind our back
            raise BadArgument(argument, "must have isolation_level=None: use labkit.connect()")
    return conn


def execute(db, sql: str, params: Any = ()) -> list[tuple]:
    """Run one statement with bound ``params`` and return all its rows, fetched."""
    return _run(db, sql, params)[0]


def rowcount(db, sql: str, params: Any = ()) -> int:
    """Run one write statement like :func:`execute` and return how many rows it changed."""
    return _run(db, sql, params)[1]


def _run(db, sql: str, params: Any) -> tuple[list[tuple], int]:
    conn = check_db(db)
    if not isinstance(sql, str):
        raise BadArgumentType("sql", f"must be a str, got {type(sql).__name__}")
    try:
        if "$" in sql and isinstance(params, Sequence) and not isinstance(params, (str, bytes)):
            if (names := _names(sql)) and len(params) != len(names):
                raise BadArgument("params", f"{len(params)} values for $1..${len(names)}")
            if names and not isinstance(conn, Engine):  # by SQLite's names for them, "1", "2", ...
                params = dict(zip(names, params))
        with contextlib.closing(conn.execute(sql, params)) as cursor:
            return cursor.fetchall(), cursor.rowcount
    except OverflowError as exc:
        raise BadArgument("params", f"{exc} (SQLite integers are below 2**63)") from None
    except sqlite3.Error as exc:
        raise _translate(exc, conn, params) from exc


#: what holds no parameter: quoted text and names, dollar-quoted bodies, comments
_TEXT = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|(\$(?:[A-Za-z_]\w*)?\$).*?\1|--[^\n]*""", re.S)


@functools.lru_cache(maxsize=1024)
def _names(sql: str) -> tuple[str, ...]:
    """SQLite's names of ``$1`` .. the highest ``$n`` of ``sql`` (its statements are constants)."""
    most = max(map(int, re.findall(r"(?<![\w$])\$(\d+)", _TEXT.sub(" ", sql))), default=0)
    return tuple(map(str, range(1, most + 1)))


def _translate(exc: sqlite3.Error, conn: sqlite3.Connection, params: Any = ()) -> LabkitError:
    text = str(exc)
    if isinstance(exc, sqlite3.ProgrammingError):  # misuse: say which argument
        if "closed" in text:
            return BadArgument("db", "the database connection is closed")
        if "one statement at a time" in text:
            return BadArgument("sql", "must be exactly one statement")
        if any(word in text for word in ("bind", "supplied", "parameters")):
            return BadArgument("params", text)
    if text.startswith("labkit: "):  # a trigger of Fence.protect RAISEd one of its fixed texts
        return _refusal(text, conn, params)
    if "locked" in text or "busy" in text:
        return Busy(conn.execute("PRAGMA busy_timeout").fetchone()[0])
    if "readonly" in text or "read-only" in text:
        return BadArgument("db", "the database is read-only")
    if "not a database" in text or "malformed" in text:
        return BadArgument("db", "the file is not a SQLite database")
    return LabkitError(f"SQLite error: {text}")


def _refusal(text: str, conn: sqlite3.Connection, params: Any) -> LabkitError:
    if text == "labkit: generation must be an integer":
        return BadArgumentType("generation", "a fenced row's token must be an integer")
    if text == "labkit: job_id must not be NULL":
        return BadArgument("job_id", "a fenced row's job_id must not be NULL")
    if text == "labkit: no fence row for this job":
        return LabkitError("a protected row's job has no fence row: make it with Fence(db, job)")
    if text == "labkit: token never issued":
        return BadArgument("generation", "a protected row's token is above every one issued")
    if text == "labkit: a fence row is never deleted":
        return LabkitError("job_fence: a protected database never deletes or renames a fence row")
    if text == "labkit: generation was never issued":
        return BadArgument("generation", "is above every one this database's leases issued")
    named = params if isinstance(params, Mapping) else {}  # values bound by position tell nothing
    job, current = named.get("job_id", named.get("job")), None
    sql = "SELECT epoch, generation FROM job_fence WHERE job_id = $1"
    with contextlib.suppress(sqlite3.Error):
        if isinstance(job, str) and (row := conn.execute(sql, {"1": job}).fetchone()):
            current = row[1] if row[0] == 0 else tuple(row)
    return StaleGeneration(named.get("generation"), current, job)


@contextlib.contextmanager
def transaction(db) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE``, then ``COMMIT`` on success or ``ROLLBACK`` on any exception."""
    conn = check_db(db)
    if in_transaction(conn):
        raise BadArgument("db", "a transaction is already open on this connection")
    execute(conn, "BEGIN IMMEDIATE")
    try:
        yield conn
        execute(conn, "COMMIT")
    except BaseException as exc:  # from the block or from COMMIT: undo it all
        with contextlib.suppress(sqlite3.Error, LabkitError):
            execute(conn, "ROLLBACK")
        if isinstance(exc, sqlite3.Error) and str(exc).startswith("labkit: "):
            raise _translate(exc, conn) from exc  # a trigger's refusal met by a sqlite-utils call
        raise


def in_transaction(db) -> bool:
    """Whether a transaction is open on ``db``'s connection (BadArgument if it is closed)."""
    try:
        return check_db(db).in_transaction
    except sqlite3.ProgrammingError:
        raise BadArgument("db", "the database connection is closed") from None


def ensure(db, probe: str, probe_params: Any, statement: str, params: Any = ()) -> bool:
    """Run ``statement`` unless ``probe`` finds a row (probing again under the write lock)."""
    if execute(db, probe, probe_params):
        return False
    with contextlib.nullcontext() if in_transaction(db) else transaction(db):
        if execute(db, probe, probe_params):
            return False
        execute(db, statement, params)
        return True


def ensure_schema(db, table: str, ddl: str) -> bool:
    """Create ``table`` with the statement ``ddl`` unless it exists (see :func:`ensure`)."""
    sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = $1"
    return ensure(db, sql, (check_name(table, "table"),), ddl)
