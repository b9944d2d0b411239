"""Time on the holder's side: local deadlines, backoff, and the version-wait claim.

:class:`LeaseKeeper` counts a lease from the request's SEND time on the holder's clock.
:class:`VersionLease` never compares clock readings across hosts: it waits a whole
lease duration locally and claims only if the version did not move."""

import math
from dataclasses import dataclass, replace

from labkit.clock import Clock, check_clock, read_clock
from labkit.db import check_name, ensure_schema, execute, transaction
from labkit.errors import BadArgument, BadArgumentType, Busy, LeaseLost, check_number
from labkit.lease import Lease, LeaseAuthority
from labkit.mechanisms import check_type

__all__ = ["conservative_deadline", "LeaseKeeper", "backoff", "VersionLease", "Seen"]

_SCHEMA = """CREATE TABLE version_leases (name TEXT PRIMARY KEY, owner TEXT,
    generation INTEGER NOT NULL, version INTEGER NOT NULL, duration REAL NOT NULL)"""


def conservative_deadline(send_time: float, ttl: float, margin: float, max_drift: float) -> float:
    """Return ``send_time + ttl * (1 - max_drift) - margin``: when protected work must stop.

    ``send_time``: when the request left, on the holder's clock; ``max_drift`` (below 1):
    how much slower that clock may run.

    >>> conservative_deadline(send_time=100.0, ttl=10.0, margin=1.0, max_drift=0.01)
    108.9
    """
    send_time = check_number(send_time, "send_time", signed=True)
    ttl = check_number(ttl, "ttl", positive=True)
    margin = check_number(margin, "margin")
    max_drift = check_number(max_drift, "max_drift", high=math.nextafter(1.0, 0.0))  # below 1
    return send_time + ttl * (1 - max_drift) - margin


class LeaseKeeper:
    """Holds one lease and knows, on the holder's own ``clock``, until when it may act."""

    def __init__(
        self,
        authority: LeaseAuthority,
        name: str,
        owner: str,
        *,
        ttl: float,
        margin: float,
        max_drift: float,
        clock: Clock,
    ) -> None:
        self.authority = check_type(authority, LeaseAuthority, "authority")
        self.name, self.owner = check_name(name, "name"), check_name(owner, "owner")
        conservative_deadline(0.0, ttl, margin, max_drift)  # validates all three
        self.ttl, self.margin, self.max_drift = float(ttl), float(margin), float(max_drift)
        self.clock = check_clock(clock)
        self.lease: Lease | None = None
        self.deadline = -math.inf

    def acquire(self) -> Lease | None:
        """Try to acquire; on success set the deadline from this request's send time."""
        sent = read_clock(self.clock)
        lease = self.authority.try_acquire(self.name, self.owner, self.ttl)
        if lease is not None:
            self.confirm(lease, sent)
        return lease

    def renew(self) -> bool:
        """Renew now; True if confirmed. Refused: the lease is dropped. Busy: deadline unchanged."""
        if self.lease is None:
            return False
        sent = read_clock(self.clock)
        try:
            lease = self.authority.renew(self.lease)
        except LeaseLost:
            self.lost()
            return False
        except Busy:
            return False
        self.confirm(lease, sent)
        return True

    def confirm(self, lease: Lease, sent_at: float) -> float:
        """Record a grant or renewal sent at local time ``sent_at``; return the new deadline."""
        check_type(lease, Lease, "lease")
        deadline = conservative_deadline(sent_at, lease.ttl, self.margin, self.max_drift)
        if self.lease is not None and self.lease.generation == lease.generation:
            deadline = max(self.deadline, deadline)
        self.lease, self.deadline = lease, deadline
        return deadline

    def lost(self) -> None:
        """Forget the lease: the authority refused it."""
        self.lease, self.deadline = None, -math.inf

    def may_act(self) -> bool:
        """True while a lease is held and the holder's clock is before the deadline."""
        return self.lease is not None and read_clock(self.clock) < self.deadline

    def check(self) -> Lease:
        """Return the lease if protected work may start now; else raise LeaseLost."""
        if not self.may_act():
            generation = self.lease.generation if self.lease else 0
            raise LeaseLost(self.name, self.owner, generation)
        return self.lease


def backoff(attempt: int, *, base: float, cap: float, rng) -> float:
    """Seconds to sleep before retry ``attempt`` (0, 1, ...): "full jitter" exponential backoff.

    ``rng.uniform(0, min(cap, base * 2**attempt))``, as in the AWS Architecture Blog's
    "Exponential Backoff And Jitter"; ``rng`` is anything with ``uniform(a, b)``."""
    attempt = check_number(attempt, "attempt", integer=True)
    base, cap = check_number(base, "base", positive=True), check_number(cap, "cap", positive=True)
    if not callable(getattr(rng, "uniform", None)):
        raise BadArgumentType("rng", f"must have uniform(a, b), got {type(rng).__name__}")
    try:
        ceiling = min(cap, math.ldexp(base, attempt))
    except OverflowError:
        ceiling = cap
    return rng.uniform(0.0, ceiling)


@dataclass(frozen=True, slots=True)
class Seen:
    """A version lease record as one contender saw it.

    Attributes: name, owner (None when free), generation (the holder's fencing token),
    version (bumped by every claim, heartbeat and release), duration (s), and seen_at (the
    observer's local time of the observation)."""

    name: str
    owner: str | None
    generation: int
    version: int
    duration: float
    seen_at: float


class VersionLease:
    """The version-wait protocol: claim only after a whole unchanged lease duration.

    Only local elapsed time counts (bounded drift is still assumed). A paused holder
    does not notice its lapse, so writes still need the fence: ``generation`` is the token."""

    def __init__(self, db, clock: Clock) -> None:
        self.db, self.clock = db, check_clock(clock)
        ensure_schema(db, "version_leases", _SCHEMA)

    def observe(self, name: str) -> Seen:
        """Read the record of ``name`` (a free one if none) and stamp it with the local time."""
        name = check_name(name, "name")
        sql = "SELECT owner, generation, version, duration FROM version_leases WHERE name = $1"
        rows = execute(self.db, sql, (name,))
        return Seen(name, *(rows[0] if rows else (None, 0, 0, 0.0)), read_clock(self.clock))

    def waited(self, seen: Seen) -> float:
        """How long (local seconds) the observer has waited since ``seen``."""
        return read_clock(self.clock) - seen.seen_at

    def ready(self, seen: Seen) -> bool:
        """True if the record was free, or its whole duration has passed locally since ``seen``."""
        return seen.owner is None or self.waited(seen) >= seen.duration

    def claim(self, seen: Seen, owner: str, *, duration: float) -> Seen | None:
        """Claim the lease if its version is still ``seen.version``; return the new record or None.
        Raises BadArgument if ``seen`` was held and its duration has not passed yet."""
        owner = check_name(owner, "owner")
        duration = check_number(duration, "duration", positive=True)
        check_type(seen, Seen, "seen")
        if not self.ready(seen):
            raise BadArgument(
                "seen", f"waited {self.waited(seen):g} s of the record's {seen.duration:g} s"
            )
        sql = """INSERT INTO version_leases VALUES (:name, :owner, 1, 1, :duration)
            ON CONFLICT(name) DO UPDATE SET owner = :owner, generation = generation + 1,
                version = version + 1, duration = :duration
            WHERE version = :seen RETURNING generation, version"""
        params = {"owner": owner, "duration": duration, "name": seen.name, "seen": seen.version}
        with transaction(self.db):
            rows = execute(self.db, sql, params)
        if not rows:
            return None
        return Seen(seen.name, owner, *rows[0], duration, read_clock(self.clock))

    def heartbeat(self, mine: Seen) -> Seen | None:
        """Bump the version if ``mine`` (owner and generation) still holds it; None if not."""
        return self._update(mine, "version = version + 1")

    def release(self, mine: Seen) -> bool:
        """Free the record if ``mine`` still holds it; True if it did."""
        return self._update(mine, "owner = NULL, version = version + 1") is not None

    def _update(self, mine: Seen, assignment: str) -> Seen | None:
        if not isinstance(mine, Seen) or mine.owner is None:
            raise BadArgumentType(
                "mine", f"must be the Seen of claim() or heartbeat(), got {mine!r}"[:120]
            )
        sql = f"""UPDATE version_leases SET {assignment}
            WHERE name = $1 AND owner = $2 AND generation = $3 RETURNING version"""
        with transaction(self.db):
            rows = execute(self.db, sql, (mine.name, mine.owner, mine.generation))
        if not rows:
            return None
        return replace(mine, version=rows[0][0], seen_at=read_clock(self.clock))
