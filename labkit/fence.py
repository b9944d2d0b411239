"""The fence: where the effect happens, remember the highest token and refuse lower ones.

A token is a generation ``n`` (meaning ``(0, n)``) or an ``(epoch, counter)`` pair, compared as
SQLite row values, so one conditional ``UPDATE`` serves both. Equal tokens pass: one owner may
write several times. That is why a fence is not duplicate suppression; :func:`labkit.run_once` is.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from labkit.db import Engine, check_db, check_name, ensure, execute, in_transaction, quote
from labkit.db import rowcount, transaction
from labkit.errors import MAX_INT, BadArgument, BadArgumentType, LabkitError, StaleGeneration
from labkit.errors import check_number

if TYPE_CHECKING:
    import sqlite_utils

__all__ = ["Fence", "Tx", "token", "show", "unfenced", "check_tx"]


class Fence:
    """The permanent fence row of one job in ``job_fence``: the highest token accepted so far.

    >>> from labkit import connect
    >>> fence = Fence(connect(), "job")
    >>> with fence.guard(8) as tx:
    ...     tx.execute("INSERT INTO invoices VALUES ('job', 'INV-1', 100, 8) RETURNING amount")
    [(100,)]
    >>> with fence.guard(7) as tx:
    ...     _ = tx.execute("INSERT INTO invoices VALUES ('job', 'INV-2', 90, 7)")
    Traceback (most recent call last):
    labkit.errors.StaleGeneration: generation 7 is below the fence of job 'job' (already...
    >>> fence.current()
    8
    """

    def __init__(self, db, job: str) -> None:
        self.db, self.job = db, check_name(job, "job")
        sql = "INSERT INTO job_fence VALUES ($1, 0, 0) ON CONFLICT DO NOTHING"  # a racer won
        ensure(db, "SELECT 1 FROM job_fence WHERE job_id = $1", (self.job,), sql, (self.job,))

    @contextlib.contextmanager
    def guard(self, generation) -> Iterator[Tx]:
        """Raise the fence to ``generation`` or refuse; the block's writes commit with it or not."""
        epoch, counter = token(generation)
        with transaction(self.db) as conn:
            sql = """UPDATE job_fence SET epoch = $1, generation = $2
                WHERE job_id = $3 AND (epoch, generation) <= ($1, $2)"""
            if not rowcount(conn, sql, (epoch, counter, self.job)):  # the fence is above it
                raise StaleGeneration(show((epoch, counter)), self.current(), self.job)
            with _Block() as block:
                yield Tx(conn, (epoch, counter), self.job, block)  # the effect, in this transaction

    def current(self) -> int | tuple[int, int]:
        """Return the highest token accepted (an int while the epoch is 0); a lost row raises."""
        sql = "SELECT epoch, generation FROM job_fence WHERE job_id = $1"
        if not (rows := execute(self.db, sql, (self.job,))):
            raise LabkitError(f"the fence row of {self.job!r} is gone: it must never be reset")
        return show(rows[0])

    def protect(self, table: str, column: str = "generation") -> None:
        """Install triggers (PL/pgSQL on PostgreSQL) so ``table`` refuses stale rows from anyone.

        A row's token is ``(epoch, column)`` (``epoch`` 0 if the table has no such column), and
        compares with its ``job_id``'s fence as in :meth:`guard`. Refused whole: a row whose token
        is below the fence, or above the last this database's lease authority issued for the job
        (if any: elsewhere a token is no credential), or not ints, or without a job or fence row.
        A row raises its fence; no fence row is lowered, renamed or deleted. Not covered: an
        ``UPDATE`` leaving the token unchanged, ``DELETE``, ``DROP``."""
        table, column = check_name(table, "table"), check_name(column, "column")
        if table.lower() in _OWN_TABLES:
            raise BadArgument("table", f"{table!r} is one of labkit's own tables")
        if isinstance(engine := check_db(self.db), Engine):  # PostgreSQL: PL/pgSQL triggers
            return engine.protect(table, column)
        sql = """SELECT lower(name) FROM pragma_table_info($1) WHERE EXISTS (
            SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = $1 COLLATE NOCASE)"""
        if not (columns := {name for (name,) in execute(self.db, sql, (table,))}):
            raise BadArgument("table", f"there is no table named {table!r}")
        if "job_id" not in columns:
            raise BadArgument("table", f"{table!r} has no job_id column, the fenced job of a row")
        if column.lower() not in columns:
            raise BadArgument("column", f"{table!r} has no column {column!r}")
        epoch = 'NEW."epoch"' if "epoch" in columns else "0"  # the row's epoch, in the triggers
        quoted = {"table": quote(table), "column": quote(column), "epoch": epoch}
        with transaction(self.db):
            for statement in _ONCE:
                execute(self.db, statement.format(**quoted, rows=epoch.replace("NEW", "t")))
            for event in ("INSERT", "UPDATE"):
                for when, trigger in (("check", _CHECK_ROW), ("raise", _RAISE_FENCE)):
                    name = quote(f"labkit_fence:{len(table)}:{table}:{column}:{event}:{when}")
                    execute(self.db, trigger.format(name=name, event=event, **quoted))


def token(generation: Any, argument: str = "generation") -> tuple[int, int]:
    """Return ``generation`` as an ``(epoch, counter)`` pair (``n`` is ``(0, n)``), or raise."""
    if not isinstance(generation, (tuple, list)):
        return 0, check_number(generation, argument, integer=True, high=MAX_INT)
    if len(generation) != 2:
        raise BadArgument(argument, f"must be an int or an (epoch, counter), got {generation!r}")
    return tuple(check_number(n, argument, integer=True, high=MAX_INT) for n in generation)


def show(pair: tuple[int, int]) -> int | tuple[int, int]:
    """Show a token the way a student wrote it: an int while the epoch is 0."""
    return pair[1] if pair[0] == 0 else tuple(pair)


class _Block(contextlib.AbstractContextManager):
    """The ``with`` block that made a :class:`Tx`: open until it exits."""

    open = True

    def __exit__(self, *exc_info) -> None:
        self.open = False


@dataclass(frozen=True, slots=True)
class Tx:
    """The open transaction ``conn`` of a guard whose fence (of ``job``; None for :func:`unfenced`)
    accepted ``token``. Once its ``with`` block ends, it is refused everywhere."""

    conn: Any
    token: tuple[int, int]
    job: str | None = None
    _block: _Block | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self._block) is _Block:  # made by guard or unfenced, from parts they checked
            return
        if self.job is not None:
            raise BadArgument("job", "only Fence.guard makes a fenced Tx")
        check_db(self.conn, "conn")
        if not isinstance(self.token, tuple) or len(self.token) != 2:
            raise BadArgumentType("token", f"must be an (epoch, counter) tuple, got {self.token!r}")

    @property
    def live(self) -> bool:
        """True while this transaction's ``with`` block is open, and its transaction too."""
        return (self._block is None or self._block.open) and in_transaction(self.conn)

    def execute(self, sql: str, params: Any = ()) -> list[tuple]:
        """Run one statement in this transaction and return all rows (refused after the block)."""
        if not self.live:
            raise BadArgument("tx", "this transaction has ended; write inside the with block")
        return execute(self.conn, sql, params)

    @property
    def db(self) -> sqlite_utils.Database:
        """The sqlite-utils view of this transaction (it cannot refuse use after the block)."""
        if isinstance(self.conn, Engine):
            raise BadArgument("tx", "tx.db is sqlite-utils, for SQLite only: use tx.execute(sql)")
        import sqlite_utils  # on first use: it loads numpy (labkit.db.connect says why)

        return sqlite_utils.Database(self.conn)


@contextlib.contextmanager
def unfenced(db, generation=0) -> Iterator[Tx]:
    """``BEGIN IMMEDIATE`` without a fence check: its :class:`Tx` is refused by fenced stores."""
    pair = token(generation)
    with transaction(db) as conn, _Block() as block:
        yield Tx(conn, pair, None, block)


def check_tx(tx, db, job: str | None) -> Tx:
    """Return ``tx`` if it is live on ``db`` and fenced by ``job`` (None: any), else raise."""
    if not isinstance(tx, Tx):
        raise BadArgumentType("tx", f"must be a Tx from Fence.guard, got {type(tx).__name__}")
    if not tx.live:
        raise BadArgument("tx", "its transaction has ended; use it inside its with block")
    if tx.conn is not check_db(db):
        raise BadArgument("tx", "is a transaction on another database connection")
    if job is not None and tx.job is None:
        raise BadArgument("tx", "is not fenced: open it with Fence(db, job).guard(token)")
    if job is not None and tx.job != job:
        raise BadArgument("tx", f"was accepted by the fence of job {tx.job!r}, not {job!r}")
    return tx


# --- what Fence.protect installs: only quoted identifiers are formatted in (a trigger takes no
# parameters); the RAISE texts are fixed, and labkit.db turns them into labkit's errors.
_OWN_TABLES = {"job_fence", "lease_counter", "leases", "idempotency_keys"}
_ONCE = (
    # the rows already there raise their jobs' fences to their highest token (only those above)
    """INSERT INTO job_fence(job_id, epoch, generation) SELECT job_id, e, g FROM (
        SELECT t.job_id, {rows} AS e, t.{column} AS g, row_number() OVER (PARTITION BY t.job_id
        ORDER BY {rows} DESC, t.{column} DESC) AS r FROM {table} AS t WHERE t.job_id IS NOT NULL
        AND typeof(t.{column}) = 'integer' AND typeof({rows}) = 'integer') AS x WHERE r = 1 AND
        NOT EXISTS (SELECT 1 FROM job_fence WHERE job_id = x.job_id AND (epoch, generation) >= (e, g))
    ON CONFLICT(job_id) DO UPDATE SET epoch = excluded.epoch, generation = excluded.generation
    WHERE (excluded.epoch, excluded.generation) > (epoch, generation)""",
    # the fence rows themselves: never lower, never renamed or deleted, never replaced lower
    """CREATE TRIGGER IF NOT EXISTS labkit_fence_never_lower BEFORE UPDATE ON job_fence
    BEGIN SELECT CASE
        WHEN NEW.job_id IS NOT OLD.job_id THEN RAISE(ABORT, 'labkit: a fence row is never deleted')
        WHEN (NEW.epoch, NEW.generation) < (OLD.epoch, OLD.generation)
            THEN RAISE(ABORT, 'labkit: stale generation')
    END; END""",
    """CREATE TRIGGER IF NOT EXISTS labkit_fence_never_deleted BEFORE DELETE ON job_fence
    BEGIN SELECT RAISE(ABORT, 'labkit: a fence row is never deleted'); END""",
    """CREATE TRIGGER IF NOT EXISTS labkit_fence_never_replaced_lower BEFORE INSERT ON job_fence
    WHEN EXISTS (SELECT 1 FROM job_fence WHERE job_id = NEW.job_id
                 AND (epoch, generation) > (NEW.epoch, NEW.generation))
    BEGIN SELECT RAISE(ABORT, 'labkit: stale generation'); END""",
)

_CHECK_ROW = """
CREATE TRIGGER IF NOT EXISTS {name} BEFORE {event} ON {table}
BEGIN
    SELECT CASE
        WHEN typeof(NEW.{column}) <> 'integer' OR typeof({epoch}) <> 'integer'
            THEN RAISE(ABORT, 'labkit: generation must be an integer')
        WHEN NEW.job_id IS NULL THEN RAISE(ABORT, 'labkit: job_id must not be NULL')
        ELSE CASE (SELECT ({epoch}, NEW.{column}) >= (epoch, generation) FROM job_fence
            WHERE job_id = NEW.job_id) WHEN 0 THEN RAISE(ABORT, 'labkit: stale generation')
        WHEN 1 THEN CASE WHEN ({epoch}, NEW.{column}) > (SELECT 0, generation FROM lease_counter
            WHERE name = NEW.job_id) THEN RAISE(ABORT, 'labkit: token never issued') END
        ELSE RAISE(ABORT, 'labkit: no fence row for this job') END  -- one fence lookup: NULL
    END;
END"""  # before a row is written, judge it; after it really was (INSERT OR IGNORE), raise its fence
_RAISE_FENCE = """
CREATE TRIGGER IF NOT EXISTS {name} AFTER {event} ON {table}
BEGIN
    UPDATE job_fence SET epoch = {epoch}, generation = NEW.{column}
    WHERE job_id = NEW.job_id AND (epoch, generation) < ({epoch}, NEW.{column});
END"""
