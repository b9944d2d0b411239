"""Leases: time-limited permission to act. Expiry lets a successor start; it does not stop the
old holder (that is the fence's job). Generations come from ``lease_counter``, a permanent row
per name that releasing or expiring leases never touches, so each one is above all before it.
"""

import math
from dataclasses import dataclass

from labkit.clock import Clock, check_clock, read_clock
from labkit.db import Engine, check_db, check_name, execute, rowcount, transaction
from labkit.errors import MAX_INT, BadArgument, BadArgumentType, LeaseHeld, LeaseLost
from labkit.errors import check_number

__all__ = ["Lease", "LeaseAuthority"]


@dataclass(frozen=True, slots=True)
class Lease:
    """``owner`` holds ``name`` until ``expires_at``; ``generation`` strictly increases per name."""

    name: str
    owner: str
    generation: int
    expires_at: float
    ttl: float

    def __post_init__(self) -> None:
        check_name(self.name, "name")
        check_name(self.owner, "owner")
        check_number(self.generation, "generation", integer=True, high=MAX_INT)
        check_number(self.ttl, "ttl", positive=True)
        check_number(self.expires_at, "expires_at", signed=True)


class LeaseAuthority:
    """Grants, renews and releases leases, reading time from ``clock`` (on a server, its own).

    >>> from labkit import connect, VirtualClock
    >>> clock = VirtualClock()
    >>> leases = LeaseAuthority(connect(), clock)
    >>> a = leases.acquire("job", "A", ttl=10)
    >>> a.generation, leases.try_acquire("job", "B", ttl=10)
    (1, None)
    >>> _ = clock.advance(7)
    >>> leases.renew(a).expires_at, leases.current("job").owner
    (17.0, 'A')
    >>> leases.release(a), leases.current("job"), leases.acquire("job", "B", ttl=10).generation
    (None, None, 2)
    """

    def __init__(self, db, clock: Clock = Engine) -> None:
        server = isinstance(conn := check_db(db), Engine)  # then its clock, by default
        clock = conn.lease_clock(clock) if server else None if clock is Engine else clock
        self.db, self.clock = db, check_clock(clock)

    def try_acquire(self, name: str, owner: str, ttl: float) -> Lease | None:
        """Return a new :class:`Lease` with the next generation, or None while ``name`` is held."""
        name, owner = check_name(name, "name"), check_name(owner, "owner")
        ttl = check_number(ttl, "ttl", positive=True)
        with transaction(self.db):
            expires_at = _expiry(now := read_clock(self.clock), ttl, "ttl")
            sql = """INSERT INTO lease_counter VALUES ($1, 0)
                ON CONFLICT(name) DO UPDATE SET generation = lease_counter.generation"""
            execute(self.db, sql, (name,))  # the counter row: made if missing, locked till COMMIT
            sql = """UPDATE lease_counter SET generation = generation + 1 WHERE name = $1
                AND NOT EXISTS (SELECT 1 FROM leases WHERE name = $1 AND expires_at > $2)
                RETURNING generation"""
            won = execute(self.db, sql, (name, now))
            if not won:
                return None
            lease = Lease(name, owner, won[0][0], expires_at, ttl)
            sql = """INSERT INTO leases VALUES ($1, $2, $3, $4, $5) ON CONFLICT(name) DO UPDATE SET
                owner = excluded.owner, generation = excluded.generation,
                expires_at = excluded.expires_at, ttl = excluded.ttl"""
            execute(self.db, sql, (name, owner, lease.generation, expires_at, ttl))
            return lease

    def acquire(self, name: str, owner: str, ttl: float) -> Lease:
        """Like :meth:`try_acquire`, but a held name raises LeaseHeld, even for its holder."""
        if (lease := self.try_acquire(name, owner, ttl)) is not None:
            return lease
        if (held := self.current(name)) is None:  # expired between the two reads: say what we saw
            raise LeaseHeld(name, "<expired meanwhile>", -1, read_clock(self.clock))
        raise LeaseHeld(name, held.owner, held.generation, held.expires_at)

    def renew(self, lease: Lease) -> Lease:
        """Return ``lease`` extended to now + ``lease.ttl``, or raise LeaseLost."""
        lease = _check_lease(lease)
        with transaction(self.db):
            sql = "UPDATE lease_counter SET generation = generation WHERE name = $1"  # the lock
            execute(self.db, sql, (lease.name,))
            expires_at = _expiry(now := read_clock(self.clock), lease.ttl, "lease")
            sql = """UPDATE leases SET expires_at = $1
                WHERE name = $2 AND owner = $3 AND generation = $4 AND expires_at > $5"""
            params = (expires_at, lease.name, lease.owner, lease.generation, now)
            changed = rowcount(self.db, sql, params)
        if changed != 1:
            raise LeaseLost(lease.name, lease.owner, lease.generation)
        return Lease(lease.name, lease.owner, lease.generation, expires_at, lease.ttl)

    def release(self, lease: Lease) -> None:
        """Delete ``lease`` if owner and generation still match, else raise LeaseLost."""
        lease = _check_lease(lease)
        with transaction(self.db):
            sql = "DELETE FROM leases WHERE name = $1 AND owner = $2 AND generation = $3"
            changed = rowcount(self.db, sql, (lease.name, lease.owner, lease.generation))
        if changed != 1:
            raise LeaseLost(lease.name, lease.owner, lease.generation)

    def current(self, name: str) -> Lease | None:
        """Return the unexpired lease on ``name``, or None. A read: it never blocks."""
        sql = "SELECT * FROM leases WHERE name = $1 AND expires_at > $2"
        rows = execute(self.db, sql, (check_name(name, "name"), read_clock(self.clock)))
        return Lease(*rows[0]) if rows else None


def _expiry(now: float, ttl: float, argument: str) -> float:
    if not math.isfinite(now + ttl):
        raise BadArgument(argument, f"now + ttl must be finite, got {now} + {ttl}")
    return now + ttl


def _check_lease(lease) -> Lease:
    if not isinstance(lease, Lease):
        raise BadArgumentType("lease", f"must be a Lease, got {type(lease).__name__}")
    return lease
