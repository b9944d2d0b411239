"""Who issues the numbers: counters that stay ordered, and counters that don't.

A fence is only as good as the numbers it is given. An issuer must never hand
out a token that a resource could still accept from someone else. This module
shows the safe issuers next to the ways a counter quietly moves backward:

* :class:`DurableCounter`: the permanent ``lease_counter`` row the
  :class:`~labkit.LeaseAuthority` already uses, one transaction per number.
* :class:`ReplicatedIssuer`: a counter on a primary whose log reaches a replica
  ``lag`` seconds later; :meth:`~ReplicatedIssuer.failover` promotes the replica
  and forgets whatever had not arrived, so numbers are handed out again.
* :func:`backup` and :func:`restore`: real SQLite backups; restoring an old one
  moves even a durable counter backward.
* :func:`naive_cleanup` (wrong: the next holder starts at 1 again) and
  :func:`cleanup_expired` (right: lease rows go, the counter stays).
* :class:`EpochAuthority` and :class:`EpochIssuer`: tokens ``(epoch, counter)``
  compared as row values; after disaster recovery a new epoch from a durable
  authority orders every new token above every old one.
* :func:`bump_is_safe`: adding a large constant works only when it clears every
  number ever issued, which after a disaster is exactly what nobody knows.
"""

from __future__ import annotations

import sqlite3

from labkit.clock import Clock, check_clock, read_clock
from labkit.db import check_db, check_name, connect, ensure_schema, execute, transaction
from labkit.errors import BadArgument, BadArgumentType, LabkitError
from labkit.fence import show, token
from labkit.errors import check_number, MAX_INT

__all__ = [
    "DurableCounter",
    "EpochAuthority",
    "EpochIssuer",
    "ReplicatedIssuer",
    "backup",
    "restore",
    "cleanup_expired",
    "naive_cleanup",
    "bump_is_safe",
]

_ISSUER_SCHEMA = {
    "epoch_counter": """CREATE TABLE epoch_counter (
        name TEXT PRIMARY KEY, epoch INTEGER NOT NULL, counter INTEGER NOT NULL)""",
    "repl_log": """CREATE TABLE repl_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, epoch INTEGER NOT NULL,
        counter INTEGER NOT NULL, committed_at REAL NOT NULL)""",
    "repl_applied": """CREATE TABLE repl_applied (
        id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL)""",
    "epochs": """CREATE TABLE epochs (
        name TEXT PRIMARY KEY, epoch INTEGER NOT NULL)""",
}


def _ensure(db) -> None:
    for table, ddl in _ISSUER_SCHEMA.items():
        ensure_schema(db, table, ddl)


class DurableCounter:
    """The permanent generation row of one lease name, as a plain issuer.

    It is the same ``lease_counter`` row :class:`~labkit.LeaseAuthority` uses:
    one ``BEGIN IMMEDIATE`` transaction per number, committed before the number
    is handed out, so a number is never issued twice while the file survives.

    Example:
        >>> from labkit import connect
        >>> counter = DurableCounter(connect(), "invoice-run")
        >>> counter.next(), counter.next(), counter.current()
        (1, 2, 2)
    """

    def __init__(self, db, name: str) -> None:
        self.db, self.name = db, check_name(name, "name")

    def next(self) -> int:
        """Commit and return the next number (1 for a name never seen)."""
        with transaction(self.db):
            execute(
                self.db,
                "INSERT INTO lease_counter(name, generation) VALUES (?, 0) "
                "ON CONFLICT(name) DO NOTHING",
                (self.name,),
            )
            return execute(
                self.db,
                "UPDATE lease_counter SET generation = generation + 1 "
                "WHERE name = ? RETURNING generation",
                (self.name,),
            )[0][0]

    def current(self) -> int:
        """Return the last number issued (0 if none)."""
        rows = execute(self.db, "SELECT generation FROM lease_counter WHERE name = ?", (self.name,))
        return rows[0][0] if rows else 0

    def bump(self, constant: int) -> int:
        """Add ``constant`` to the counter (the "large constant" recovery) and return it.

        Safe only if the result is at least every number ever issued: see :func:`bump_is_safe`.
        """
        constant = check_number(constant, "constant", integer=True, high=MAX_INT)
        with transaction(self.db):
            execute(
                self.db,
                "INSERT INTO lease_counter(name, generation) VALUES (?, 0) "
                "ON CONFLICT(name) DO NOTHING",
                (self.name,),
            )
            return execute(
                self.db,
                "UPDATE lease_counter SET generation = generation + ? "
                "WHERE name = ? RETURNING generation",
                (constant, self.name),
            )[0][0]

    def __repr__(self) -> str:
        return f"DurableCounter(name={self.name!r})"


class EpochAuthority:
    """A durable authority for epochs: a store that is never restored or failed over.

    In production this is a consensus-backed store used within its documented
    lifetime; here it is a SQLite file kept apart from the stores that can lose data.

    Example:
        >>> from labkit import connect
        >>> epochs = EpochAuthority(connect())
        >>> epochs.next_epoch("invoice-run"), epochs.next_epoch("invoice-run")
        (1, 2)
    """

    def __init__(self, db) -> None:
        self.db = db
        _ensure(db)

    def next_epoch(self, name: str) -> int:
        """Commit and return an epoch above every epoch this authority gave ``name``."""
        name = check_name(name, "name")
        with transaction(self.db):
            return execute(
                self.db,
                """
                INSERT INTO epochs(name, epoch) VALUES (?, 1)
                ON CONFLICT(name) DO UPDATE SET epoch = epoch + 1
                RETURNING epoch""",
                (name,),
            )[0][0]

    def current(self, name: str) -> int:
        """Return the last epoch given to ``name`` (0 if none)."""
        rows = execute(
            self.db, "SELECT epoch FROM epochs WHERE name = ?", (check_name(name, "name"),)
        )
        return rows[0][0] if rows else 0

    def __repr__(self) -> str:
        return "EpochAuthority()"


class EpochIssuer:
    """Issues tokens ``(epoch, counter)`` from one row, read and raised in one transaction.

    :class:`~labkit.Fence` compares tokens as row values, so every token of epoch 2
    is above every token of epoch 1 whatever their counters. While the epoch is 0
    a token is shown as a plain int. After a failover or a restore, call
    :meth:`start_epoch` before issuing again: the new epoch comes from a durable
    :class:`EpochAuthority`, and the row's epoch only ever moves up.

    Example:
        >>> from labkit import connect
        >>> store, durable = connect(), EpochAuthority(connect())
        >>> issuer = EpochIssuer(store, "invoice-run")
        >>> issuer.issue(), issuer.start_epoch(durable), issuer.issue()
        (1, 1, (1, 1))
    """

    def __init__(self, db, name: str) -> None:
        self.db, self.name = db, check_name(name, "name")
        _ensure(db)

    def issue(self) -> int | tuple[int, int]:
        """Commit and return the next token."""
        with transaction(self.db):
            return show(_issue(self.db, self.name))

    def start_epoch(self, authority: EpochAuthority) -> int:
        """Take a new epoch from ``authority``, reset the counter to 0 in it, and return it.

        Raises:
            BadArgument: the row already has an epoch at or above the authority's new one
                (the authority is not the durable one this row was ordered by).
        """
        if not isinstance(authority, EpochAuthority):
            raise BadArgumentType(
                "authority", f"must be an EpochAuthority, got {type(authority).__name__}"
            )
        epoch = authority.next_epoch(self.name)
        with transaction(self.db):
            execute(
                self.db,
                "INSERT INTO epoch_counter(name, epoch, counter) VALUES (?, 0, 0) "
                "ON CONFLICT(name) DO NOTHING",
                (self.name,),
            )
            moved = execute(
                self.db,
                "UPDATE epoch_counter SET epoch = :epoch, counter = 0 "
                "WHERE name = :name AND epoch < :epoch RETURNING epoch",
                {"epoch": epoch, "name": self.name},
            )
        if not moved:
            raise BadArgument("authority", f"epoch {epoch} is not above this issuer's epoch")
        return epoch

    def bump(self, constant: int) -> int | tuple[int, int]:
        """Add ``constant`` to the counter within the current epoch and return the last token.

        The "large constant" recovery: safe only if it clears every token ever
        issued (see :func:`bump_is_safe`). :meth:`start_epoch` needs no such guess.
        """
        constant = check_number(constant, "constant", integer=True, high=MAX_INT)
        with transaction(self.db):
            execute(
                self.db,
                "INSERT INTO epoch_counter(name, epoch, counter) VALUES (?, 0, 0) "
                "ON CONFLICT(name) DO NOTHING",
                (self.name,),
            )
            return show(
                execute(
                    self.db,
                    "UPDATE epoch_counter SET counter = counter + ? WHERE name = ? "
                    "RETURNING epoch, counter",
                    (constant, self.name),
                )[0]
            )

    def current(self) -> int | tuple[int, int]:
        """Return the last token issued (0 if none)."""
        rows = execute(
            self.db, "SELECT epoch, counter FROM epoch_counter WHERE name = ?", (self.name,)
        )
        return show(rows[0]) if rows else 0

    def __repr__(self) -> str:
        return f"EpochIssuer(name={self.name!r})"


def _issue(db, name: str) -> tuple[int, int]:
    execute(
        db,
        "INSERT INTO epoch_counter(name, epoch, counter) VALUES (?, 0, 0) "
        "ON CONFLICT(name) DO NOTHING",
        (name,),
    )
    return execute(
        db,
        "UPDATE epoch_counter SET counter = counter + 1 WHERE name = ? RETURNING epoch, counter",
        (name,),
    )[0]


class ReplicatedIssuer:
    """An issuer on a primary whose changes reach a replica ``lag`` seconds later.

    Both stores are real SQLite files. :meth:`issue` commits the new token and a
    log entry on the primary and answers at once (asynchronous replication).
    :meth:`replicate` applies to the replica every log entry at least ``lag``
    seconds old. :meth:`failover` applies what is due, promotes the replica and
    drops the old primary: entries still in flight are gone, so the new primary
    hands out those tokens again.

    Args:
        primary, replica: two labkit databases (separate files).
        clock: where "now" comes from. name: the counter's name.
        lag: replication delay in seconds (>= 0).

    Example:
        >>> from labkit import connect, VirtualClock
        >>> clock = VirtualClock()
        >>> issuer = ReplicatedIssuer(connect(), connect(), clock, "run", lag=5)
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
            epoch, counter = _issue(self.primary, self.name)
            execute(
                self.primary,
                "INSERT INTO repl_log(name, epoch, counter, committed_at) VALUES (?, ?, ?, ?)",
                (self.name, epoch, counter, read_clock(self.clock)),
            )
        return show((epoch, counter))

    def replicate(self) -> int:
        """Apply every log entry at least ``lag`` seconds old to the replica; return how many."""
        if self.replica is None:
            return 0
        rows = execute(self.replica, "SELECT seq FROM repl_applied WHERE id = 1")
        applied = rows[0][0] if rows else 0
        due = execute(
            self.primary,
            "SELECT seq, name, epoch, counter FROM repl_log "
            "WHERE seq > ? AND committed_at + ? <= ? ORDER BY seq",
            (applied, self.lag, read_clock(self.clock)),
        )
        if not due:
            return 0
        with transaction(self.replica):
            for _seq, name, epoch, counter in due:
                execute(
                    self.replica,
                    """
                    INSERT INTO epoch_counter(name, epoch, counter) VALUES (?, ?, ?)
                    ON CONFLICT(name) DO UPDATE SET epoch = excluded.epoch, counter = excluded.counter""",
                    (name, epoch, counter),
                )
            execute(
                self.replica,
                "INSERT INTO repl_applied(id, seq) VALUES (1, ?) "
                "ON CONFLICT(id) DO UPDATE SET seq = excluded.seq",
                (due[-1][0],),
            )
        return len(due)

    def failover(self) -> int:
        """Promote the replica (after applying what is due) and return how many entries were lost.

        Raises:
            BadArgument: there is no replica left to promote.
        """
        if self.replica is None:
            raise BadArgument("replica", "already promoted; there is no replica left")
        self.replicate()
        rows = execute(self.replica, "SELECT seq FROM repl_applied WHERE id = 1")
        lost = execute(
            self.primary,
            "SELECT count(*) FROM repl_log WHERE seq > ?",
            (rows[0][0] if rows else 0,),
        )[0][0]
        self.primary, self.replica = self.replica, None
        return lost

    def issuer(self) -> EpochIssuer:
        """The :class:`EpochIssuer` view of the current primary (to start a new epoch)."""
        return EpochIssuer(self.primary, self.name)

    def current(self) -> int | tuple[int, int]:
        """Return the last token the current primary issued (0 if none)."""
        return self.issuer().current()

    def __repr__(self) -> str:
        return f"ReplicatedIssuer(name={self.name!r}, lag={self.lag:g}, replica={self.replica is not None})"


def backup(db, path: str) -> None:
    """Copy the whole database ``db`` into the file ``path`` with SQLite's online backup.

    Raises:
        BadArgument: ``path`` cannot be opened. LabkitError: the backup failed.
    """
    target = connect(path)
    try:
        check_db(db).backup(target.conn)
    except sqlite3.Error as exc:
        raise LabkitError(f"backup failed: {exc}") from exc
    finally:
        target.conn.close()


def restore(db, path: str) -> None:
    """Replace the whole content of ``db`` with the backup in ``path`` (a disaster recovery).

    Everything committed after the backup is gone, counters included.

    Raises:
        BadArgument: ``path`` cannot be opened. LabkitError: the restore failed.
    """
    source = connect(path)
    try:
        source.conn.backup(check_db(db))
    except sqlite3.Error as exc:
        raise LabkitError(f"restore failed: {exc}") from exc
    finally:
        source.conn.close()


def cleanup_expired(db, clock: Clock, name: str) -> int:
    """Delete ``name``'s lease row if it has expired; keep its generation. Return rows deleted.

    The right cleanup: the next acquire still gets a number above every one issued.
    """
    check_db(db)
    clock, name = check_clock(clock), check_name(name, "name")
    with transaction(db):
        return len(
            execute(
                db,
                "DELETE FROM leases WHERE name = ? AND expires_at <= ? RETURNING name",
                (name, read_clock(clock)),
            )
        )


def naive_cleanup(db, clock: Clock, name: str) -> int:
    """The wrong cleanup: delete an expired lease row AND its counter. Return rows deleted.

    The next acquire starts again at generation 1, which every resource that has
    seen a higher generation rejects, or worse, a resource that was reset too accepts.
    """
    check_db(db)
    clock, name = check_clock(clock), check_name(name, "name")
    with transaction(db):
        gone = len(
            execute(
                db,
                "DELETE FROM leases WHERE name = ? AND expires_at <= ? RETURNING name",
                (name, read_clock(clock)),
            )
        )
        if not execute(db, "SELECT 1 FROM leases WHERE name = ?", (name,)):
            gone += len(
                execute(db, "DELETE FROM lease_counter WHERE name = ? RETURNING name", (name,))
            )
        return gone


def bump_is_safe(restored, constant: int, highest_issued) -> bool:
    """Return whether the next token after the bump is above every token ever issued.

    After a restore the counter holds ``restored``; after adding ``constant`` the
    next token is ``restored + constant + 1``, so the bump is safe exactly when
    ``restored + constant >= highest_issued``. The catch: after a disaster
    ``highest_issued`` is exactly the number that was lost, so the constant needs
    a proven bound (e.g. maximum issue rate times the longest possible data loss).

    Example:
        >>> bump_is_safe(6, 1000, 8), bump_is_safe(6, 1000, 2000)
        (True, False)
    """
    restored, highest = token(restored, "restored"), token(highest_issued, "highest_issued")
    constant = check_number(constant, "constant", integer=True, high=MAX_INT)
    return (restored[0], restored[1] + constant) >= highest
