"""Leases: time-limited permission to act, handed out by an authority.

A lease lets a successor start when the holder goes quiet. It does not stop
the old holder: expiry is not cancellation (that is the fence's job).

Generations come from ``lease_counter``, a permanent row per name kept apart
from the lease rows. Releasing, expiring or cleaning up lease rows never
touches it, so every acquire gets a number above every number issued before.
"""

from __future__ import annotations

from dataclasses import dataclass

import math

from labkit.clock import Clock, check_clock, read_clock
from labkit.db import check_db, check_name, execute, rowcount, transaction
from labkit.errors import BadArgument, BadArgumentType, LeaseHeld, LeaseLost
from labkit.errors import check_number, MAX_INT

__all__ = ["Lease", "LeaseAuthority"]


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease as the authority granted it.

    Attributes:
        name: what is leased, e.g. ``"invoice-run"``.
        owner: who holds it.
        generation: the fencing token issued with it; strictly increasing per name.
        expires_at: the authority's time at which it expires (expired when ``now >= expires_at``).
        ttl: the lease's length in seconds; a renewal extends by this much.

    Constructing one checks its fields (``BadArgument``/``BadArgumentType`` naming
    the field), so a hand-made lease with, say, ``generation=True`` never reaches SQL.
    """

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
        if isinstance(self.expires_at, bool) or not isinstance(self.expires_at, (int, float)):
            raise BadArgumentType(
                "expires_at", f"must be a number, got {type(self.expires_at).__name__}"
            )
        if not math.isfinite(self.expires_at):
            raise BadArgument("expires_at", f"must be finite, got {self.expires_at!r}")


class LeaseAuthority:
    """Grants, renews and releases leases, reading time from ``clock``.

    Each operation is one ``BEGIN IMMEDIATE`` transaction whose outcome is the
    row count of one conditional statement.

    Example:
        >>> from labkit import connect, VirtualClock
        >>> clock = VirtualClock(); leases = LeaseAuthority(connect(), clock)
        >>> a = leases.acquire("job", "A", ttl=10)
        >>> (a.generation, a.expires_at)
        (1, 10.0)
    """

    def __init__(self, db, clock: Clock) -> None:
        check_db(db)
        self.db, self.clock = db, check_clock(clock)

    def try_acquire(self, name: str, owner: str, ttl: float) -> Lease | None:
        """Acquire ``name`` for ``owner`` if no unexpired lease exists, else return None.

        Args:
            name: what to lease. owner: who asks. ttl: seconds (> 0, finite).

        Returns:
            The new :class:`Lease` with the next generation, or ``None`` while any
            unexpired lease on ``name`` exists (the caller's own included: use renew).

        Raises:
            BadArgument, BadArgumentType: for bad input (nothing written).
            Busy: when the database stays locked past the busy timeout.

        Example:
            >>> from labkit import connect, VirtualClock
            >>> leases = LeaseAuthority(connect(), VirtualClock())
            >>> leases.try_acquire("job", "A", ttl=10).generation
            1
            >>> leases.try_acquire("job", "B", ttl=10) is None
            True
        """
        name, owner = check_name(name, "name"), check_name(owner, "owner")
        ttl = check_number(ttl, "ttl", positive=True)
        with transaction(self.db):
            now = read_clock(self.clock)
            if not math.isfinite(now + ttl):
                raise BadArgument("ttl", f"now + ttl must be finite, got {now} + {ttl}")
            execute(
                self.db,
                "INSERT INTO lease_counter(name, generation) VALUES (?, 0) "
                "ON CONFLICT(name) DO NOTHING",
                (name,),
            )
            won = execute(
                self.db,
                """
                UPDATE lease_counter SET generation = generation + 1
                WHERE name = :name AND NOT EXISTS (
                    SELECT 1 FROM leases WHERE name = :name AND expires_at > :now)
                RETURNING generation""",
                {"name": name, "now": now},
            )
            if not won:
                return None
            lease = Lease(name, owner, won[0][0], now + ttl, ttl)
            execute(
                self.db,
                """
                INSERT INTO leases(name, owner, generation, expires_at, ttl)
                VALUES (:name, :owner, :generation, :expires_at, :ttl)
                ON CONFLICT(name) DO UPDATE SET owner = excluded.owner,
                    generation = excluded.generation, expires_at = excluded.expires_at,
                    ttl = excluded.ttl""",
                {
                    "name": name,
                    "owner": owner,
                    "generation": lease.generation,
                    "expires_at": lease.expires_at,
                    "ttl": ttl,
                },
            )
            return lease

    def acquire(self, name: str, owner: str, ttl: float) -> Lease:
        """Acquire ``name`` for ``owner``, or raise :class:`~labkit.LeaseHeld` while it is held.

        Like :meth:`try_acquire`, but a held name is an error carrying the holder,
        its generation and its expiry. The holder itself gets LeaseHeld too: to
        keep a lease, renew it.

        Args:
            name: what to lease. owner: who asks. ttl: seconds (> 0, finite).

        Returns:
            The new :class:`Lease`, with a generation above every earlier one for ``name``.

        Raises:
            LeaseHeld: an unexpired lease on ``name`` exists; nothing was written.
            BadArgument, BadArgumentType, Busy: as for :meth:`try_acquire`.

        Example:
            >>> from labkit import connect, VirtualClock
            >>> clock = VirtualClock(); leases = LeaseAuthority(connect(), clock)
            >>> a = leases.acquire("job", "A", ttl=10)
            >>> clock.advance(10); leases.acquire("job", "B", ttl=10).generation
            10.0
            2
        """
        lease = self.try_acquire(name, owner, ttl)
        if lease is None:
            held = self.current(name)
            if held is None:  # expired between the two reads: report what we saw
                raise LeaseHeld(name, "<expired meanwhile>", -1, read_clock(self.clock))
            raise LeaseHeld(name, held.owner, held.generation, held.expires_at)
        return lease

    def renew(self, lease: Lease) -> Lease:
        """Extend ``lease`` to ``now + lease.ttl`` if its owner and generation still hold it.

        Args:
            lease: the lease as last granted or renewed.

        Returns:
            A new :class:`Lease`: same generation, ``expires_at = now + lease.ttl``.

        Raises:
            LeaseLost: the lease expired, was released, or belongs to someone else now;
                nothing was changed.
            BadArgumentType: ``lease`` is not a Lease.

        Example:
            >>> from labkit import connect, VirtualClock
            >>> clock = VirtualClock(); leases = LeaseAuthority(connect(), clock)
            >>> a = leases.acquire("job", "A", ttl=10)
            >>> clock.advance(7); leases.renew(a).expires_at
            7.0
            17.0
        """
        lease = _check_lease(lease)
        with transaction(self.db):
            now = read_clock(self.clock)
            expires_at = now + lease.ttl
            if not math.isfinite(expires_at):
                raise BadArgument("lease", f"now + ttl must be finite, got {now} + {lease.ttl}")
            changed = rowcount(
                self.db,
                """
                UPDATE leases SET expires_at = :expires_at
                WHERE name = :name AND owner = :owner AND generation = :generation
                  AND expires_at > :now""",
                {
                    "expires_at": expires_at,
                    "name": lease.name,
                    "owner": lease.owner,
                    "generation": lease.generation,
                    "now": now,
                },
            )
        if changed != 1:
            raise LeaseLost(lease.name, lease.owner, lease.generation)
        return Lease(lease.name, lease.owner, lease.generation, expires_at, lease.ttl)

    def release(self, lease: Lease) -> None:
        """Delete ``lease`` only if its owner and generation match the stored lease.

        A late release from an old holder never deletes its successor's lease.

        Args:
            lease: the lease to give back.

        Raises:
            LeaseLost: nothing matched; nothing was changed.
            BadArgumentType: ``lease`` is not a Lease.

        Example:
            >>> from labkit import connect, VirtualClock
            >>> leases = LeaseAuthority(connect(), VirtualClock())
            >>> leases.release(leases.acquire("job", "A", ttl=10))
            >>> leases.current("job") is None
            True
        """
        lease = _check_lease(lease)
        with transaction(self.db):
            changed = rowcount(
                self.db,
                """
                DELETE FROM leases
                WHERE name = :name AND owner = :owner AND generation = :generation""",
                {"name": lease.name, "owner": lease.owner, "generation": lease.generation},
            )
        if changed != 1:
            raise LeaseLost(lease.name, lease.owner, lease.generation)

    def current(self, name: str) -> Lease | None:
        """Return the unexpired lease on ``name``, or None. A read: it never blocks.

        Example:
            >>> from labkit import connect, VirtualClock
            >>> leases = LeaseAuthority(connect(), VirtualClock())
            >>> leases.current("job") is None
            True
            >>> leases.acquire("job", "A", ttl=10) == leases.current("job")
            True
        """
        name = check_name(name, "name")
        rows = execute(
            self.db,
            "SELECT name, owner, generation, expires_at, ttl FROM leases "
            "WHERE name = ? AND expires_at > ?",
            (name, read_clock(self.clock)),
        )
        return Lease(*rows[0]) if rows else None

    def __repr__(self) -> str:
        return f"LeaseAuthority(clock={self.clock!r})"


def _check_lease(lease) -> Lease:
    if not isinstance(lease, Lease):
        raise BadArgumentType("lease", f"must be a Lease, got {type(lease).__name__}")
    return lease
