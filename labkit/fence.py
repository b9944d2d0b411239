"""The fence: where the effect happens, remember the highest token and refuse lower ones.

A token is a generation ``n`` (meaning ``(0, n)``) or an ``(epoch, counter)``
pair. The fence compares them as SQLite row values, ``(epoch, generation) <=
(:epoch, :generation)``, so one conditional ``UPDATE`` serves both. Equal tokens
pass: one owner may write several times. That is why a fence is not duplicate
suppression; :func:`labkit.run_once` is.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import sqlite_utils

from labkit.db import (
    check_db,
    check_name,
    ensure,
    execute,
    in_transaction,
    quote,
    transaction,
)
from labkit.errors import BadArgument, BadArgumentType, LabkitError, StaleGeneration
from labkit.errors import check_number, MAX_INT

__all__ = ["Fence", "Tx", "token", "unfenced", "check_tx"]

_OWN_TABLES = {"job_fence", "lease_counter", "leases", "idempotency_keys", "labkit_protected"}

# The triggers of Fence.protect. Only quoted identifiers are formatted in (a
# trigger cannot take bound parameters); the messages are fixed literals that
# labkit.db translates. The WHEN clause is the fast path: a row carrying exactly
# the fence's token needs nothing done (one index lookup). Otherwise one CASE
# makes every check, and the upsert raises the fence in the same statement as
# the row's write (creating the fence row if the job had none).
_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS {name} BEFORE {event} ON {table}
WHEN NOT EXISTS (SELECT 1 FROM job_fence WHERE job_id = NEW.job_id AND epoch = 0
                 AND generation = NEW.{column} AND typeof(NEW.{column}) = 'integer')
BEGIN
    SELECT CASE
        WHEN typeof(NEW.{column}) <> 'integer'
            THEN RAISE(ABORT, 'labkit: generation must be an integer')
        WHEN NEW.job_id IS NULL
            THEN RAISE(ABORT, 'labkit: job_id must not be NULL')
        WHEN (0, NEW.{column}) < (SELECT epoch, generation FROM job_fence WHERE job_id = NEW.job_id)
            THEN RAISE(ABORT, 'labkit: stale generation')
    END;
    INSERT INTO job_fence(job_id, epoch, generation) VALUES (NEW.job_id, 0, NEW.{column})
        ON CONFLICT(job_id) DO UPDATE SET generation = excluded.generation
        WHERE generation < excluded.generation;
END"""


def _missing(job: str) -> LabkitError:
    return LabkitError(
        f"the fence row of job {job!r} is gone: a fence must never be reset; "
        "restore it with its highest token"
    )


def token(generation: Any, argument: str = "generation") -> tuple[int, int]:
    """Return ``generation`` as an ``(epoch, counter)`` pair; an int ``n`` means ``(0, n)``.

    Raises:
        BadArgumentType, BadArgument: for bools, floats, negatives, values >= 2**63,
            or a pair that is not two such ints.
    """
    if isinstance(generation, (tuple, list)):
        if len(generation) != 2:
            raise BadArgument(
                argument, f"must be an int or an (epoch, counter) pair, got {generation!r}"
            )
        return check_number(generation[0], argument, integer=True, high=MAX_INT), check_number(
            generation[1], argument, integer=True, high=MAX_INT
        )
    return 0, check_number(generation, argument, integer=True, high=MAX_INT)


def show(pair: tuple[int, int]) -> int | tuple[int, int]:
    """Show a token the way a student wrote it: an int while the epoch is 0."""
    return pair[1] if pair[0] == 0 else tuple(pair)


class _Block:
    """Whether the ``with`` block that made a :class:`Tx` is still open (set False on exit)."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open = True


@dataclass(frozen=True, slots=True)
class Tx:
    """An open write transaction, as :meth:`Fence.guard` (or :func:`unfenced`) hands it out.

    A ``Tx`` is live only while the ``with`` block that made it is open: once
    the block ends, :meth:`execute` refuses, and so does every store that takes
    a ``tx``, even if a later transaction is open on the same connection.

    Attributes:
        conn: the sqlite3 connection, inside ``BEGIN IMMEDIATE``.
        token: the accepted ``(epoch, counter)`` (``(0, 0)`` for an unfenced one by default).
        job: the job whose fence accepted ``token``; None for an unfenced transaction.
            Only :meth:`Fence.guard` makes a ``Tx`` with a job.

    Constructing one by hand, ``Tx(conn, token)``, gives an unfenced ``Tx`` that
    is live while its connection is inside a transaction; prefer :func:`unfenced`.
    """

    conn: Any
    token: tuple[int, int]
    job: str | None = None
    _block: _Block | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_db(self.conn, "conn")
        if not isinstance(self.token, tuple) or len(self.token) != 2:
            raise BadArgumentType("token", f"must be an (epoch, counter) tuple, got {self.token!r}")
        if self.job is not None:
            check_name(self.job, "job")
            if not isinstance(self._block, _Block):
                raise BadArgument(
                    "job", "only Fence.guard makes a fenced Tx; use Fence(db, job).guard(token)"
                )

    @property
    def live(self) -> bool:
        """True while this transaction's ``with`` block is open (and its connection in a transaction)."""
        if self._block is not None and not self._block.open:
            return False
        return in_transaction(self.conn)

    def execute(self, sql: str, params: Any = ()) -> list[tuple]:
        """Run one statement in this transaction with bound ``params``; return all rows.

        The rows are a fully fetched list, so nothing is left open at ``COMMIT``.

        Raises:
            BadArgument: the transaction has ended (the ``with`` block is over): a
                write here would escape the fence, so it is refused, even inside a
                later transaction on the same connection.

        Example:
            >>> from labkit import connect, Fence
            >>> with Fence(connect(), "job").guard(1) as tx:
            ...     tx.execute("SELECT generation FROM job_fence")
            [(1,)]
        """
        if not self.live:
            raise BadArgument("tx", "this transaction has ended; write inside the with block")
        return execute(self.conn, sql, params)

    @property
    def db(self) -> sqlite_utils.Database:
        """The sqlite-utils view of the same connection and transaction.

        Its writes (``tx.db["invoices"].insert({...})``) commit or roll back with
        the guard. Unlike :meth:`execute` it cannot refuse use after the block ends.
        """
        return sqlite_utils.Database(self.conn)


@contextlib.contextmanager
def _open(conn, generation: tuple[int, int], job: str | None) -> Iterator[Tx]:
    block = _Block()
    try:
        yield Tx(conn, generation, job, block)
    finally:
        block.open = False


@contextlib.contextmanager
def unfenced(db, generation=0) -> Iterator[Tx]:
    """``BEGIN IMMEDIATE`` without any fence check, yielding an unfenced :class:`Tx` (``job`` None).

    The unprotected path, and the transaction :func:`labkit.run_once` opens on a
    database. The ``Tx`` carries ``generation`` as its token but nothing checked
    it, so fenced stores (:class:`~labkit.mechanisms.effects.FencedFileStore`,
    :class:`~labkit.mechanisms.effects.Outbox`) refuse it. It is dead once the block ends.

    Raises:
        BadArgument, BadArgumentType: ``db`` or ``generation`` is not usable (nothing ran).
        Busy: the write lock stayed taken past the busy timeout.

    Example:
        >>> from labkit import connect
        >>> with unfenced(connect(), 7) as tx:
        ...     _ = tx.execute("INSERT INTO invoices VALUES ('job', 'INV-1', 100, 7)")
        >>> tx.job, tx.live
        (None, False)
    """
    pair = token(generation)
    with transaction(db) as conn, _open(conn, pair, None) as tx:
        yield tx


def check_tx(tx, db, job: str | None, argument: str = "tx", *, fenced: bool = True) -> Tx:
    """Return ``tx`` if it is a live transaction on ``db``'s connection, fenced by ``job``'s fence.

    With ``job`` None any fenced job is accepted, but not an unfenced ``Tx``;
    with ``fenced=False`` an unfenced one is accepted too.

    Raises:
        BadArgumentType: ``tx`` is not a :class:`Tx`.
        BadArgument: its block has ended, it runs on another connection, it is
            unfenced, or another job's fence accepted it. All name ``argument``.
    """
    if not isinstance(tx, Tx):
        raise BadArgumentType(argument, f"must be a Tx from Fence.guard, got {type(tx).__name__}")
    if not tx.live:
        raise BadArgument(argument, "its transaction has ended; use it inside its with block")
    if tx.conn is not check_db(db):
        raise BadArgument(argument, "is a transaction on another database connection")
    if tx.job is None and fenced:
        raise BadArgument(argument, "is not fenced: open it with Fence(db, job).guard(token)")
    if job is not None and tx.job != job:
        raise BadArgument(argument, f"was accepted by the fence of job {tx.job!r}, not {job!r}")
    return tx


class Fence:
    """The permanent fence row of one job, kept in ``job_fence``.

    Example:
        >>> from labkit import connect
        >>> db = connect(); fence = Fence(db, "invoices")
        >>> with fence.guard(8) as tx:
        ...     _ = tx.execute("INSERT INTO invoices VALUES ('invoices', 'INV-1', 100, 8)")
        >>> fence.current()
        8
    """

    def __init__(self, db, job: str) -> None:
        self.db, self.job = db, check_name(job, "job")
        ensure(
            db,
            "SELECT 1 FROM job_fence WHERE job_id = ?",
            (self.job,),
            "INSERT INTO job_fence(job_id, epoch, generation) VALUES (?, 0, 0) "
            "ON CONFLICT(job_id) DO NOTHING",
            (self.job,),
        )

    def current(self) -> int | tuple[int, int]:
        """Return the highest token the fence has accepted (an int while the epoch is 0).

        Raises:
            LabkitError: the fence row was deleted behind labkit's back (a fence
                must never be reset; restore it with its old token).

        Example:
            >>> from labkit import connect
            >>> Fence(connect(), "job").current()
            0
        """
        rows = execute(
            self.db, "SELECT epoch, generation FROM job_fence WHERE job_id = ?", (self.job,)
        )
        if not rows:
            raise _missing(self.job)
        return show(rows[0])

    @contextlib.contextmanager
    def guard(self, generation) -> Iterator[Tx]:
        """Open ``BEGIN IMMEDIATE`` and raise the fence to ``generation``, or refuse.

        One conditional ``UPDATE ... WHERE (epoch, generation) <= (:epoch, :generation)
        RETURNING`` decides: a row back means accepted (equal tokens are accepted).
        The block's writes and the raised fence commit together, or roll back
        together on any exception. While the block runs, this transaction holds
        the write lock: a successor's guard waits for it (up to its busy timeout).

        Args:
            generation: an int ``n`` (meaning ``(0, n)``) or an ``(epoch, counter)`` pair.

        Yields:
            A :class:`Tx` for the block's writes (``tx.job`` is this fence's job);
            it is dead once the block ends.

        Raises:
            BadArgument, BadArgumentType: ``generation`` is not a token (nothing ran).
            StaleGeneration: the fence is above ``generation``; nothing was written.
            Busy: the write lock stayed taken past the busy timeout.

        Example:
            >>> from labkit import connect
            >>> fence = Fence(connect(), "job")
            >>> with fence.guard(8) as tx:
            ...     _ = tx.execute("INSERT INTO invoices VALUES ('job', 'INV-1', 100, 8)")
            >>> try:
            ...     with fence.guard(7) as tx:
            ...         _ = tx.execute("INSERT INTO invoices VALUES ('job', 'INV-2', 90, 7)")
            ... except StaleGeneration as exc:
            ...     print(exc.offered, exc.current)
            7 8
        """
        epoch, counter = token(generation)
        with transaction(self.db) as conn:
            raised = execute(
                conn,
                """
                UPDATE job_fence SET epoch = :epoch, generation = :generation
                WHERE job_id = :job AND (epoch, generation) <= (:epoch, :generation)
                RETURNING epoch, generation""",
                {"epoch": epoch, "generation": counter, "job": self.job},
            )
            if not raised:
                raise StaleGeneration(show((epoch, counter)), self.current(), self.job)
            with _open(conn, (epoch, counter), self.job) as tx:
                yield tx

    def protect(self, table: str, column: str = "generation") -> None:
        """Make SQLite itself refuse stale rows in ``table``, for every writer.

        Installs two ``BEFORE INSERT``/``BEFORE UPDATE`` triggers on ``table``. For
        each new row they compare ``(0, NEW.<column>)`` with the ``job_fence`` row
        whose ``job_id`` is the row's ``job_id``: a lower token aborts the statement
        (nothing of it is written); otherwise the same statement raises that fence
        to the row's token (creating the fence row if the job had none). A writer
        that never calls :meth:`guard` can then no longer write stale. labkit's own
        calls (:func:`labkit.db.execute`, ``tx.execute``) report the refusal as
        :class:`~labkit.StaleGeneration`; a bare ``sqlite3`` writer sees
        ``IntegrityError: labkit: stale generation``.

        Rules for the table: it must have a ``job_id`` column (the fenced job of
        each row) and ``column`` holds the writer's token as an integer (a row
        without an integer token is refused). An ``UPDATE`` must set ``column`` to
        the updater's token: the triggers judge the row as it will be. Deletes are
        not fenced. A row's int token ``n`` means ``(0, n)``, so once a fence has
        an epoch above 0 every int row is stale: writers using ``(epoch, counter)``
        tokens go through :meth:`guard` instead. Existing rows raise their jobs'
        fences to their highest token. Calling it again changes nothing.

        Args:
            table: the table to protect (not one of labkit's own tables).
            column: the integer token column, ``"generation"`` by default.

        Raises:
            BadArgument: no such table, no ``job_id`` or ``column`` column, or
                one of labkit's own tables. Nothing was changed.

        Example:
            >>> from labkit import connect
            >>> from labkit.db import execute
            >>> db = connect(); fence = Fence(db, "job"); fence.protect("invoices")
            >>> _ = execute(db, "INSERT INTO invoices VALUES ('job', 'INV-1', 120, 8)")
            >>> fence.current()
            8
            >>> try:
            ...     execute(db, "INSERT INTO invoices VALUES (:job_id, 'INV-2', 100, :generation)",
            ...             {"job_id": "job", "generation": 7})
            ... except StaleGeneration as exc:
            ...     print(exc.offered, exc.current, exc.job)
            7 8 job
        """
        table, column = check_name(table, "table"), check_name(column, "column")
        if table.lower() in _OWN_TABLES:
            raise BadArgument("table", f"{table!r} is one of labkit's own tables")
        kinds = execute(
            self.db, "SELECT type FROM sqlite_master WHERE name = ? COLLATE NOCASE", (table,)
        )
        if ("table",) not in kinds:
            raise BadArgument("table", f"there is no table named {table!r}")
        columns = {
            name.lower()
            for (name,) in execute(self.db, "SELECT name FROM pragma_table_info(?)", (table,))
        }
        if "job_id" not in columns:
            raise BadArgument(
                "table", f"{table!r} has no job_id column: protect() fences rows by job_id"
            )
        if column.lower() not in columns:
            raise BadArgument("column", f"{table!r} has no column {column!r}")
        t, c = quote(table), quote(column)
        with transaction(self.db):
            execute(
                self.db,
                "CREATE TABLE IF NOT EXISTS labkit_protected ("
                "table_name TEXT, column_name TEXT, PRIMARY KEY (table_name, column_name))",
            )
            for event in ("INSERT", "UPDATE"):
                name = quote(f"labkit_fence:{len(table)}:{table}:{column}:{event.lower()}")
                execute(self.db, _TRIGGER.format(name=name, event=event, table=t, column=c))
            execute(
                self.db,
                f"""
                INSERT INTO job_fence(job_id, epoch, generation)
                SELECT job_id, 0, max({c}) FROM {t}
                WHERE typeof({c}) = 'integer' AND job_id IS NOT NULL GROUP BY job_id
                ON CONFLICT(job_id) DO UPDATE SET generation = excluded.generation
                WHERE epoch = 0 AND generation < excluded.generation""",
            )
            execute(
                self.db,
                "INSERT INTO labkit_protected VALUES (?, ?) ON CONFLICT DO NOTHING",
                (table, column),
            )

    def __repr__(self) -> str:
        return f"Fence(job={self.job!r})"
