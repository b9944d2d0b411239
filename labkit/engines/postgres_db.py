"""labkit's database seam on PostgreSQL, through psycopg 3 (imported only when used).

:func:`connect` returns a :class:`PostgresDatabase`, the :class:`labkit.db.Engine` that the
core's ``labkit.db`` functions call in place of a sqlite3 connection. It keeps the core's
contract. It is in autocommit, so the only transactions are the ones labkit begins;
``BEGIN IMMEDIATE`` is sent as a READ COMMITTED ``BEGIN``, and the row locks that the
conditional statements take, held until COMMIT, serialise the writers (each statement then sees
what the writer before it committed). Every value is bound, every row fetched, and driver errors
become labkit's errors here. Statements go to the server as written: labkit's placeholders are
``$1, $2, ...``, PostgreSQL's own (SQLite reads them as parameters named 1, 2, ...), bound by
position through psycopg's raw cursor, so no statement is rewritten. Its clock
(:meth:`PostgresDatabase.now`) is the server's ``clock_timestamp()``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from labkit import db as core
from labkit.engines import pg_protect
from labkit.errors import MAX_INT, BadArgument, BadArgumentType, Busy, LabkitError, StaleGeneration
from labkit.errors import check_number

__all__ = ["PostgresDatabase", "ServerGone", "connect", "BEGIN"]

SCHEMA = core.SCHEMA.replace("INTEGER", "BIGINT").replace("REAL", "DOUBLE PRECISION")
SCHEMA = SCHEMA.replace("WITHOUT ROWID", "")  # SQLite's: a keyed table without a rowid index
GONE = (
    "the connection to PostgreSQL was lost{where}; the server rolled back whatever this "
    "connection had not committed, so nothing half-written stays: reconnect with "
    "labkit.connect(url) and retry"
)


SHARED = (
    "RealClock is this machine's CLOCK_BOOTTIME, its uptime: another machine using the same "
    "server reads a different one, so two authorities can both see the lease free and two "
    "holders act at once. Leave clock out: leases on a server read the server's clock"
)


class ServerGone(LabkitError):
    """No PostgreSQL server answers, or it went away: ``url`` without its password."""

    def __init__(self, url: str, message: str) -> None:
        self.url = url
        super().__init__(message)


def driver():
    """The psycopg module, imported on first use: SQLite users never need it."""
    try:
        import psycopg
    except ImportError:
        raise LabkitError("PostgreSQL needs psycopg: pip install 'psycopg[binary]'") from None
    return psycopg


def connect(url: str, *, busy_timeout_ms: int = 5000) -> PostgresDatabase:
    """Open a labkit database on the PostgreSQL server at ``url`` and install labkit's schema.

    A writer waits ``busy_timeout_ms`` for a row lock (``lock_timeout``), then raises Busy.
    """
    timeout = check_number(busy_timeout_ms, "busy_timeout_ms", integer=True, high=2**31 - 1)
    psycopg = driver()
    shown = _check_url(url, psycopg)
    try:
        conn = psycopg.connect(
            url, autocommit=True, connect_timeout=10, cursor_factory=psycopg.RawCursor
        )
    except psycopg.OperationalError as exc:
        raise _refused(str(exc), shown) from None
    db = PostgresDatabase(conn, shown, timeout)
    try:
        db.execute("SELECT set_config('lock_timeout', $1, false)", (f"{timeout}ms",))
        if db.execute("SELECT to_regclass('invoices')", ()).fetchall() == [(None,)]:
            with core.transaction(db):  # one installer at a time, even across connections
                db.execute("SELECT pg_advisory_xact_lock(hashtext('labkit schema'))", ())
                for statement in filter(str.strip, SCHEMA.split(";")):
                    db.execute(statement, ())
    except BaseException:
        conn.close()
        raise
    return db


def _check_url(url: Any, psycopg) -> str:
    """Return ``url`` without its password, or raise BadArgument naming ``url``."""
    url = core.check_name(url, "url")
    if not url.startswith(("postgresql://", "postgres://")):
        raise BadArgument("url", "must start with postgresql://, e.g. postgresql://user:pw@host/db")
    try:
        parts = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise BadArgument(
            "url", f"is not a PostgreSQL URL ({exc}): see the libpq URI format"
        ) from None
    if not str(parts.get("port", "5432")).isdigit():
        raise BadArgument("url", f"the port must be a number, got {parts['port']!r}")
    who = f"{parts.get('user', '')}@" if parts.get("user") else ""
    host = parts.get("host", "localhost")
    return f"postgresql://{who}{host}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


def _refused(text: str, shown: str) -> LabkitError:
    if "password authentication failed" in text or "no password supplied" in text:
        return BadArgument("url", f"{shown} refused the password: check the password in the URL")
    if "does not exist" in text:
        what = text.split("FATAL:", 1)[-1].strip()
        return BadArgument("url", f"{shown}: {what}; check the user and database in the URL")
    return ServerGone(
        shown,
        f"no PostgreSQL server answers at {shown} ({(text.strip() or '?').splitlines()[-1]}); "
        "start one (labkit.engines.postgres.PostgresServer) or check the host and port",
    )


#: SQLite's ``BEGIN IMMEDIATE`` here: the isolation labkit's statements are written for
BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
_SQLITE_STYLE = re.compile(r"\?|(?<![:\w]):[A-Za-z_]")  # SQLite's placeholders, met on PostgreSQL
_CONTROL = re.compile(r"\s*(BEGIN|COMMIT|END|ROLLBACK|ABORT|SAVEPOINT|RELEASE)\b", re.I)


class PostgresDatabase(core.Engine):
    """A labkit database on PostgreSQL: the :class:`labkit.db.Engine` for psycopg 3.

    The interface the core calls: ``execute(sql, params)`` (labkit's placeholders; rows fetched,
    ``rowcount``), ``in_transaction``, ``conn`` and ``isolation_level`` (as a sqlite3
    connection's), ``protect(table, column)`` (``Fence.protect``), ``now()`` and
    ``lease_clock(clock)`` (the server's clock for leases). It raises only labkit's errors.

    Its ``conn`` is itself (a sqlite-utils Database's ``conn`` is the sqlite3 connection), so
    ``execute(db, ...)``, ``transaction(db)``, ``Fence(db, ...)`` and ``db.conn.close()`` work
    as on SQLite. ``pg`` is the psycopg connection, ``url`` the URL without its password, and
    ``trips`` counts the round trips to the server (each a network wait).
    """

    isolation_level = None  # as labkit's sqlite3 connections: no transaction behind our back

    def __init__(self, pg, url: str, busy_timeout_ms: int) -> None:
        self.pg, self.url, self.busy_timeout_ms, self.trips = pg, url, busy_timeout_ms, 0

    @property
    def conn(self) -> PostgresDatabase:
        """Itself, as a sqlite-utils Database's ``conn`` is its sqlite3 connection."""
        return self

    def __repr__(self) -> str:
        return f"<labkit PostgresDatabase {self.url}>"

    def now(self) -> float:
        """The server's ``clock_timestamp()`` in seconds: one clock for every machine using it."""
        return self.run("SELECT extract(epoch FROM clock_timestamp())::float8").rows[0][0]

    def lease_clock(self, clock):
        """The clock a LeaseAuthority here reads: this server's unless given; never RealClock,
        which is one machine's uptime (another machine's differs, by hours)."""
        from labkit.clock import RealClock

        if isinstance(clock, RealClock):
            raise BadArgument("clock", SHARED)
        return self if clock is core.Engine else clock  # the default: the engine's own

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (or failed and not yet rolled back)."""
        if self.pg.broken:
            raise ServerGone(self.url, GONE.format(where=""))
        if self.pg.closed:
            raise BadArgument("db", "the database connection is closed")
        return self.pg.info.transaction_status.name in ("INTRANS", "INERROR")

    def close(self) -> None:
        self.pg.close()

    def execute(self, sql: str, params: Any = ()) -> _Rows:
        """Run one labkit statement (``$1, $2, ...`` placeholders); its rows, all fetched."""
        if sql.strip().upper() == "BEGIN IMMEDIATE":  # transaction control in SQLite's words
            sql = BEGIN
        return self.run(sql, _bind(params))

    def run(self, sql: str, params: Any = ()) -> _Rows:
        """Run one statement as written, ``params`` bound to its ``$1, $2, ...`` (a raw
        cursor: ``%`` and ``?`` mean nothing to it); driver errors become labkit errors.

        Inside a transaction, a failed statement aborts all of it on PostgreSQL but only itself on
        SQLite; a savepoint around the statement keeps SQLite's rule (the error still raises).
        The savepoint, the statement and its release go in one pipeline: one round trip."""
        import psycopg

        inside = self.pg.info.transaction_status.name == "INTRANS" and not _CONTROL.match(sql)
        try:
            if not inside:
                self.trips += 1
                with self.pg.cursor() as cursor:
                    cursor.execute(sql, params, binary=True)  # extended protocol: one statement
                    rows = cursor.fetchall() if cursor.description is not None else []
                    return _Rows(rows, cursor.rowcount)
            return self._alone(sql, params, psycopg)
        except psycopg.Error as exc:
            raise self._translate(exc, params, sql) from exc
        except (TypeError, KeyError) as exc:  # psycopg met params it cannot bind
            raise BadArgument("params", f"cannot bind {exc}") from None

    def _alone(self, sql: str, params: Any, psycopg) -> _Rows:
        """``sql`` between SAVEPOINT and RELEASE, sent together; rolled back alone if it fails."""
        self.trips += 1
        try:
            with self.pg.pipeline() as pipe, self.pg.cursor() as mark, self.pg.cursor() as cursor:
                mark.execute("SAVEPOINT labkit_statement")
                cursor.execute(sql, params, binary=True)
                mark.execute("RELEASE SAVEPOINT labkit_statement")
                pipe.sync()  # the one round trip: all three sent, all three answered
                rows = cursor.fetchall() if cursor.description is not None else []
                return _Rows(rows, cursor.rowcount)
        except psycopg.Error:
            if not self.pg.broken:
                self.trips += 1
                with self.pg.pipeline(), self.pg.cursor() as mark:
                    mark.execute("ROLLBACK TO SAVEPOINT labkit_statement")
                    mark.execute("RELEASE SAVEPOINT labkit_statement")
            raise

    def protect(self, table: str, column: str) -> None:
        """Fence.protect on PostgreSQL: PL/pgSQL triggers (see :mod:`labkit.engines.pg_protect`)."""
        pg_protect.protect(self, table, column)

    def _translate(self, exc, params: Any, sql: str = "") -> LabkitError:
        import psycopg.errors as e

        text = (exc.diag.message_primary if exc.diag else None) or str(exc)
        if isinstance(exc, (e.LockNotAvailable, e.DeadlockDetected, e.SerializationFailure)):
            return Busy(self.busy_timeout_ms)  # all three: nothing written, retry
        if self.pg.closed and not self.pg.broken:
            return BadArgument("db", "the database connection is closed")
        if isinstance(exc, e.ProtocolViolation) and "parameters" in text and not self.pg.broken:
            return BadArgument("params", f"{text}: give one value for each $1, $2, ...")
        if self.pg.broken or isinstance(exc, e.OperationalError):
            return ServerGone(self.url, GONE.format(where=f" ({text.strip()})"))
        if isinstance(exc, e.RaiseException) and text.startswith("labkit: "):
            detail = exc.diag.message_detail or ""
            return refusal(text, tuple(map(int, detail.split(","))) if detail else None)
        if isinstance(exc, e.SyntaxError) and _SQLITE_STYLE.search(sql):
            why = "(not ? or :name), and labkit sends every statement as written"
            return BadArgument("sql", f"{text}: PostgreSQL's placeholders are $1, $2, ... {why}")
        if "cannot insert multiple commands" in text:
            return BadArgument("sql", "must be exactly one statement")
        if isinstance(exc, e.DataError) or (
            isinstance(exc, e.ProgrammingError) and not exc.sqlstate
        ):
            return BadArgument("params", text)  # a value the column refuses, or bad placeholders
        if isinstance(exc, e.ReadOnlySqlTransaction):
            return BadArgument("db", "the database is read-only")
        return LabkitError(f"PostgreSQL error: {text}")


def refusal(text: str, fence: tuple | None) -> LabkitError:
    """The labkit error for a fence trigger's fixed ``text``, as SQLite's triggers' are reported
    (:mod:`labkit.db`); ``fence`` is the job's fence row from the trigger's DETAIL, or None."""
    if text == "labkit: generation must be an integer":
        return BadArgumentType("generation", "a fenced row's token must be an integer")
    if text == "labkit: job_id must not be NULL":
        return BadArgument("job_id", "a fenced row's job_id must not be NULL")
    if text == "labkit: no fence row for this job":
        return LabkitError("a protected row's job has no fence row: make it with Fence(db, job)")
    if text == "labkit: a fence row is never deleted":
        return LabkitError("job_fence: a protected database never deletes or renames a fence row")
    if text == "labkit: generation was never issued":
        return BadArgument(
            "generation", f"is above every one this database's leases issued ({fence[1]})"
        )
    return StaleGeneration(None, None, None)  # values bound by position name no token or job


def _bind(params: Any) -> Any:
    """``params`` as the raw cursor takes them: a sequence of SQLite's value types, bools as ints."""
    if isinstance(params, Mapping):
        raise BadArgument("params", "PostgreSQL binds $1, $2, ... by position: pass a sequence")
    if isinstance(params, (str, bytes)) or not hasattr(params, "__iter__"):
        raise BadArgument("params", f"must be a sequence, not {type(params).__name__}")
    return [_value(v, i) for i, v in enumerate(params, 1)]


def _value(value: Any, where) -> Any:
    if value is None or isinstance(value, (str, float, bytes)):
        return value
    if isinstance(value, int):
        if not -MAX_INT - 1 <= value <= MAX_INT:
            raise BadArgument("params", f"parameter {where}: integers are below 2**63")
        return int(value)
    raise BadArgument(
        "params", f"parameter {where}: type {type(value).__name__!r} is not supported"
    )


class _Rows:
    """A statement's result, fetched: ``fetchall()``, ``fetchone()``, ``rowcount``."""

    def __init__(self, rows: list[tuple], rowcount: int) -> None:
        self.rows, self.rowcount = rows, rowcount

    def fetchall(self) -> list[tuple]:
        return self.rows

    def fetchone(self) -> tuple | None:
        return self.rows[0] if self.rows else None

    def close(self) -> None:
        pass
