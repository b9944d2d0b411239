"""Who issues the numbers: counters that stay ordered, and counters that move backward.

A failover to a lagging replica (:class:`ReplicatedIssuer`), a :func:`restore` and a
:func:`naive_cleanup` all hand numbers out again. The repair: tokens ``(epoch, counter)``
from :class:`EpochIssuer`, each new epoch from a durable :class:`EpochAuthority`."""

import sqlite3

from labkit.clock import Clock, check_clock, read_clock
from labkit.db import check_db, check_name, connect, ensure_schema, execute, rowcount, transaction
from labkit.errors import MAX_INT, BadArgument, LabkitError, check_number
from labkit.fence import show, token
from labkit.mechanisms import check_type

__all__ = ["EpochAuthority", "EpochIssuer", "ReplicatedIssuer", "backup", "restore"]
__all__ += ["cleanup_expired", "naive_cleanup", "bump_is_safe"]

_SCHEMA = {
    "epoch_counter": """CREATE TABLE epoch_counter (
        name TEXT PRIMARY KEY, epoch INTEGER NOT NULL, counter INTEGER NOT NULL)""",
    "repl_log": """CREATE TABLE repl_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, epoch INTEGER NOT NULL,
        counter INTEGER NOT NULL, committed_at REAL NOT NULL)""",
    "repl_applied": """CREATE TABLE repl_applied (
        id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL)""",
    "epochs": "CREATE TABLE epochs (name TEXT PRIMARY KEY, epoch INTEGER NOT NULL)",
}


def _ensure(db) -> None:
    for table, ddl in _SCHEMA.items():
        ensure_schema(db, table, ddl)


def _advance(db, name: str, step: int = 1) -> tuple[int, int]:
    """Add ``step`` to ``name``'s counter (a new row starts at epoch 0); return the token."""
    sql = """INSERT INTO epoch_counter(name, epoch, counter) VALUES (:name, 0, :step)
        ON CONFLICT(name) DO UPDATE SET counter = counter + :step RETURNING epoch, counter"""
    return execute(db, sql, {"name": name, "step": step})[0]


class EpochAuthority:
    """Epochs from a store that is never restored or failed over (in production: consensus)."""

    def __init__(self, db) -> None:
        self.db = db
        _ensure(db)

    def next_epoch(self, name: str) -> int:
        """Commit and return an epoch above every epoch this authority gave ``name``."""
        name = check_name(name, "name")
        sql = """INSERT INTO epochs(name, epoch) VALUES ($1, 1)
            ON CONFLICT(name) DO UPDATE SET epoch = epoch + 1 RETURNING epoch"""
        with transaction(self.db):
            return execute(self.db, sql, (name,))[0][0]

    def current(self, name: str) -> int:
        """Return the last epoch given to ``name`` (0 if none)."""
        name = check_name(name, "name")
        rows = execute(self.db, "SELECT epoch FROM epochs WHERE name = $1", (name,))
        return rows[0][0] if rows else 0


class EpochIssuer:
    """Tokens ``(epoch, counter)`` from one row, shown as a plain int in epoch 0.
    After a failover or a restore, call :meth:`start_epoch` before issuing again."""

    def __init__(self, db, name: str) -> None:
        self.db, self.name = db, check_name(name, "name")
        _ensure(db)

    def issue(self) -> int | tuple[int, int]:
        """Commit and return the next token."""
        with transaction(self.db):
            return show(_advance(self.db, self.name))

    def start_epoch(self, authority: EpochAuthority) -> int:
        """Take a new epoch from ``authority``, restart the counter in it, and return it; raises
        BadArgument if the row's epoch is not below the new one (the wrong authority)."""
        epoch = check_type(authority, EpochAuthority, "authority").next_epoch(self.name)
        sql = """INSERT INTO epoch_counter(name, epoch, counter) VALUES (:name, :epoch, 0)
            ON CONFLICT(name) DO UPDATE SET epoch = :epoch, counter = 0 WHERE epoch < :epoch
            RETURNING epoch"""
        with transaction(self.db):
            moved = execute(self.db, sql, {"epoch": epoch, "name": self.name})
        if not moved:
            raise BadArgument("authority", f"epoch {epoch} is not above this issuer's epoch")
        return epoch

    def bump(self, constant: int) -> int | tuple[int, int]:
        """Add ``constant`` to the counter (the "large constant" repair); return the last token."""
        constant = check_number(constant, "constant", integer=True, high=MAX_INT)
        with transaction(self.db):
            return show(_advance(self.db, self.name, constant))

    def current(self) -> int | tuple[int, int]:
        """Return the last token issued (0 if none)."""
        sql = "SELECT epoch, counter FROM epoch_counter WHERE name = $1"
        rows = execute(self.db, sql, (self.name,))
        return show(rows[0]) if rows else 0


class ReplicatedIssuer:
    """An issuer on a primary whose log reaches a replica ``lag`` seconds later (two files).

    >>> from labkit import connect, VirtualClock
    >>> issuer = ReplicatedIssuer(connect(), connect(), VirtualClock(), "run", lag=5)
    >>> issuer.issue(), issuer.failover(), issuer.issue()   # lost in flight, issued again
    (1, 1, 1)
    """

    def __init__(self, primary, replica, clock: Clock, name: str, *, lag: float) -> None:
        self.clock, self.lag = check_clock(clock), check_number(lag, "lag")
        self.name = check_name(name, "name")
        if primary is replica:
            raise BadArgument("replica", "must be a different database from the primary")
        self.primary, self.replica = primary, replica
        _ensure(primary)
        _ensure(replica)

    def issue(self) -> int | tuple[int, int]:
        """Commit the next token on the primary, log it for the replica, and return it."""
        with transaction(self.primary):
            epoch, counter = _advance(self.primary, self.name)
            sql = "INSERT INTO repl_log(name, epoch, counter, committed_at) VALUES ($1, $2, $3, $4)"
            execute(self.primary, sql, (self.name, epoch, counter, read_clock(self.clock)))
        return show((epoch, counter))

    def _applied(self) -> int:
        rows = execute(self.replica, "SELECT seq FROM repl_applied WHERE id = 1")
        return rows[0][0] if rows else 0

    def replicate(self) -> int:
        """Apply every log entry at least ``lag`` seconds old to the replica; return how many."""
        if self.replica is None:
            return 0
        sql = """SELECT seq, name, epoch, counter FROM repl_log
            WHERE seq > $1 AND committed_at + $2 <= $3 ORDER BY seq"""
        due = execute(self.primary, sql, (self._applied(), self.lag, read_clock(self.clock)))
        with transaction(self.replica):
            for seq, *row in due:
                execute(
                    self.replica, "INSERT OR REPLACE INTO epoch_counter VALUES ($1, $2, $3)", row
                )
                execute(self.replica, "INSERT OR REPLACE INTO repl_applied VALUES (1, $1)", (seq,))
        return len(due)

    def failover(self) -> int:
        """Promote the replica (after applying what is due); return how many entries were lost."""
        if self.replica is None:
            raise BadArgument("replica", "already promoted; there is no replica left")
        self.replicate()
        sql = "SELECT count(*) FROM repl_log WHERE seq > $1"
        lost = execute(self.primary, sql, (self._applied(),))[0][0]
        self.primary, self.replica = self.replica, None
        return lost

    def issuer(self) -> EpochIssuer:
        """The :class:`EpochIssuer` view of the current primary (to start a new epoch)."""
        return EpochIssuer(self.primary, self.name)

    def current(self) -> int | tuple[int, int]:
        """Return the last token the current primary issued (0 if none)."""
        return self.issuer().current()


def _copy(db, path: str, *, into_file: bool) -> None:
    conn, other = check_db(db), connect(path).conn
    source, target = (conn, other) if into_file else (other, conn)
    try:
        source.backup(target)
    except sqlite3.Error as exc:
        raise LabkitError(f"{'backup' if into_file else 'restore'} failed: {exc}") from exc
    finally:
        other.close()


def backup(db, path: str) -> None:
    """Copy the whole database ``db`` into the file ``path`` (SQLite's online backup)."""
    _copy(db, path, into_file=True)


def restore(db, path: str) -> None:
    """Replace all of ``db`` with the backup in ``path``: everything committed since is gone."""
    _copy(db, path, into_file=False)


def _cleanup(db, clock: Clock, name: str, *, counter_too: bool) -> int:
    now, name = read_clock(clock), check_name(name, "name")
    with transaction(db):
        gone = rowcount(db, "DELETE FROM leases WHERE name = $1 AND expires_at <= $2", (name, now))
        if counter_too and not execute(db, "SELECT 1 FROM leases WHERE name = $1", (name,)):
            gone += rowcount(db, "DELETE FROM lease_counter WHERE name = $1", (name,))
    return gone


def cleanup_expired(db, clock: Clock, name: str) -> int:
    """The right cleanup: delete ``name``'s expired lease row, keep its counter; count rows."""
    return _cleanup(db, clock, name, counter_too=False)


def naive_cleanup(db, clock: Clock, name: str) -> int:
    """The wrong cleanup: delete the expired lease row AND its counter (the next holder gets 1)."""
    return _cleanup(db, clock, name, counter_too=True)


def bump_is_safe(restored, constant: int, highest_issued) -> bool:
    """Whether ``restored + constant >= highest_issued``: the next token is above every old one.
    The catch: after a disaster ``highest_issued`` is exactly the number that was lost."""
    restored, highest = token(restored, "restored"), token(highest_issued, "highest_issued")
    constant = check_number(constant, "constant", integer=True, high=MAX_INT)
    return (restored[0], restored[1] + constant) >= highest
