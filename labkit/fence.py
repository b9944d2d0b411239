"""The fence: where the effect happens, remember the highest token and refuse lower ones.

A token is a generation ``n`` (meaning ``(0, n)``) or an ``(epoch, counter)``
pair. The fence compares them as SQLite row values, ``(epoch, generation) <=
(:epoch, :generation)``, so one conditional ``UPDATE`` serves both. Equal tokens
pass: one owner may write several times. That is why a fence is not duplicate
suppression; :func:`labkit.run_once` is.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import sqlite_utils

from .db import check_name, execute, transaction
from .errors import BadArgument, BadArgumentType, StaleGeneration

__all__ = ["Fence", "Tx", "token"]

_LIMIT = 2 ** 63


def _int(value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgumentType(argument, f"must be an int, got {type(value).__name__}")
    if not 0 <= value < _LIMIT:
        raise BadArgument(argument, f"must be in 0 .. 2**63-1, got {value}")
    return value


def token(generation: Any, argument: str = "generation") -> tuple[int, int]:
    """Return ``generation`` as an ``(epoch, counter)`` pair; an int ``n`` means ``(0, n)``.

    Raises:
        BadArgumentType, BadArgument: for bools, floats, negatives, values >= 2**63,
            or a pair that is not two such ints.
    """
    if isinstance(generation, (tuple, list)):
        if len(generation) != 2:
            raise BadArgument(argument, f"must be an int or an (epoch, counter) pair, got {generation!r}")
        return _int(generation[0], argument), _int(generation[1], argument)
    return 0, _int(generation, argument)


def show(pair: tuple[int, int]) -> int | tuple[int, int]:
    """Show a token the way a student wrote it: an int while the epoch is 0."""
    return pair[1] if pair[0] == 0 else tuple(pair)


@dataclass(frozen=True, slots=True)
class Tx:
    """An open fenced transaction.

    Attributes:
        conn: the sqlite3 connection, inside ``BEGIN IMMEDIATE``.
        token: the accepted ``(epoch, counter)``.
    """

    conn: Any
    token: tuple[int, int]

    def execute(self, sql: str, params: Any = ()) -> list[tuple]:
        """Run one statement in this transaction with bound ``params``; return all rows."""
        return execute(self.conn, sql, params)

    @property
    def db(self) -> sqlite_utils.Database:
        """The sqlite-utils view of the same connection and transaction."""
        return sqlite_utils.Database(self.conn)


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
        if not execute(db, "SELECT 1 FROM job_fence WHERE job_id = ?", (self.job,)):
            with transaction(db):
                execute(db, "INSERT INTO job_fence(job_id, epoch, generation) VALUES (?, 0, 0) "
                            "ON CONFLICT(job_id) DO NOTHING", (self.job,))

    def current(self) -> int | tuple[int, int]:
        """Return the highest token the fence has accepted (an int while the epoch is 0)."""
        rows = execute(self.db, "SELECT epoch, generation FROM job_fence WHERE job_id = ?", (self.job,))
        return show(rows[0])

    @contextlib.contextmanager
    def guard(self, generation) -> Iterator[Tx]:
        """Open ``BEGIN IMMEDIATE`` and raise the fence to ``generation``, or refuse.

        The block's writes and the raised fence commit together, or roll back
        together on any exception. While the block runs, this transaction holds
        the write lock: a successor's guard waits for it (up to its busy timeout).

        Raises:
            StaleGeneration: the fence is above ``generation``; nothing was written.
            Busy: the write lock stayed taken past the busy timeout.
        """
        epoch, counter = token(generation)
        with transaction(self.db) as conn:
            raised = execute(conn, """
                UPDATE job_fence SET epoch = :epoch, generation = :generation
                WHERE job_id = :job AND (epoch, generation) <= (:epoch, :generation)
                RETURNING epoch, generation""",
                {"epoch": epoch, "generation": counter, "job": self.job})
            if not raised:
                raise StaleGeneration(show((epoch, counter)), self.current(), self.job)
            yield Tx(conn, (epoch, counter))

    def __repr__(self) -> str:
        return f"Fence(job={self.job!r})"
