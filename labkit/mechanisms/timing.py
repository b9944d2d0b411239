"""Time on the holder's side: local deadlines, backoff, and the version-wait claim.

A renewal extends the permission at the authority, but its answer spends time
in the network, and the holder's clock is not the authority's. Three tools:

* :func:`conservative_deadline` and :class:`LeaseKeeper`: count the lease from
  the renewal REQUEST's send time on the holder's monotonic clock, minus a
  margin and the worst drift, and stop protected work once it passes without
  a confirmed renewal.
* :func:`backoff`: "full jitter" exponential backoff as a pure function.
* :class:`VersionLease`: the alternative protocol that never compares clock
  readings across hosts: observe a version, wait a full lease duration locally,
  claim only if the version did not move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.clock import Clock, check_clock, read_clock
from labkit.db import check_name, ensure, ensure_schema, execute, transaction
from labkit.errors import BadArgument, BadArgumentType, Busy, LeaseLost
from labkit.lease import Lease, LeaseAuthority
from labkit.errors import check_number

__all__ = ["conservative_deadline", "LeaseKeeper", "backoff", "VersionLease", "Seen"]


def conservative_deadline(send_time: float, ttl: float, margin: float, max_drift: float) -> float:
    """Return the local time after which the holder must stop issuing protected work.

    The formula is ``send_time + ttl * (1 - max_drift) - margin``:

    * ``send_time``: when the holder SENT the (re)acquire request, on its own
      monotonic clock. The authority started the lease no earlier than that, so
      counting from the send time is never late; counting from the response's
      arrival is (by the whole round trip).
    * ``ttl * (1 - max_drift)``: if the holder's clock may run up to ``max_drift``
      (a fraction, e.g. 0.001 for 1000 ppm) slower than the authority's, then
      ``ttl * (1 - max_drift)`` local seconds are at most ``ttl`` real seconds.
    * ``- margin``: room for the work in flight and everything not modelled.

    A result at or before ``send_time`` means: no protected work at all.

    Raises:
        BadArgumentType, BadArgument: naming the argument, for a non-number, a
            non-finite value, ``ttl <= 0``, ``margin < 0``, or ``max_drift``
            outside ``0 <= max_drift < 1``.

    Example:
        >>> conservative_deadline(send_time=100.0, ttl=10.0, margin=1.0, max_drift=0.01)
        108.9
    """
    send_time = check_number(send_time, "send_time", signed=True)
    ttl = check_number(ttl, "ttl", positive=True)
    margin = check_number(margin, "margin")
    max_drift = check_number(max_drift, "max_drift", signed=True)
    if not 0 <= max_drift < 1:
        raise BadArgument("max_drift", f"must be in 0 <= max_drift < 1, got {max_drift!r}")
    return send_time + ttl * (1 - max_drift) - margin


class LeaseKeeper:
    """Holds one lease and knows, on the holder's own clock, until when it may act.

    Every confirmed (re)acquire sets :attr:`deadline` with
    :func:`conservative_deadline` from the request's send time. A renewal that
    fails or gets no answer (``Busy``) leaves the old deadline in place, so
    :meth:`may_act` turns False on time; a refused renewal (``LeaseLost``)
    ends the lease at once. Requests already sent are the fence's business.

    Args:
        authority: the :class:`~labkit.LeaseAuthority`. name, owner: the lease.
        ttl, margin, max_drift: as for :func:`conservative_deadline`.
        clock: the HOLDER's monotonic clock (not necessarily the authority's).

    Example:
        >>> from labkit import connect, VirtualClock, LeaseAuthority
        >>> clock = VirtualClock(); keeper = LeaseKeeper(
        ...     LeaseAuthority(connect(), clock), "job", "A", ttl=10, margin=1, max_drift=0, clock=clock)
        >>> keeper.acquire().generation, keeper.deadline
        (1, 9.0)
        >>> _ = clock.advance(9.5); keeper.may_act()
        False
    """

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
        if not isinstance(authority, LeaseAuthority):
            raise BadArgumentType(
                "authority", f"must be a LeaseAuthority, got {type(authority).__name__}"
            )
        self.name, self.owner = check_name(name, "name"), check_name(owner, "owner")
        conservative_deadline(0.0, ttl, margin, max_drift)  # validates all three
        self.ttl, self.margin, self.max_drift = float(ttl), float(margin), float(max_drift)
        self.authority, self.clock = authority, check_clock(clock)
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
        """Record a confirmed grant or renewal whose request left at local time ``sent_at``.

        For callers that carry the messages themselves (the simulation). The
        deadline only moves forward. Returns the deadline.
        """
        if not isinstance(lease, Lease):
            raise BadArgumentType("lease", f"must be a Lease, got {type(lease).__name__}")
        deadline = conservative_deadline(sent_at, lease.ttl, self.margin, self.max_drift)
        if self.lease is None or self.lease.generation != lease.generation:
            self.deadline = deadline
        else:
            self.deadline = max(self.deadline, deadline)
        self.lease = lease
        return self.deadline

    def lost(self) -> None:
        """Forget the lease: the authority refused it. No protected work from now on."""
        self.lease, self.deadline = None, -math.inf

    def may_act(self) -> bool:
        """True while a lease is held and the holder's clock is before the deadline."""
        return self.lease is not None and read_clock(self.clock) < self.deadline

    def check(self) -> Lease:
        """Return the lease if protected work may start now, else raise.

        Raises:
            LeaseLost: no lease, or the local deadline has passed without a confirmed renewal.
        """
        if not self.may_act():
            generation = self.lease.generation if self.lease else 0
            raise LeaseLost(self.name, self.owner, generation)
        return self.lease

    def __repr__(self) -> str:
        held = self.lease.generation if self.lease else None
        return f"LeaseKeeper(name={self.name!r}, owner={self.owner!r}, generation={held}, deadline={self.deadline:g})"


def backoff(attempt: int, *, base: float, cap: float, rng) -> float:
    """Return how long to sleep before retry ``attempt``: "full jitter" exponential backoff.

    The algorithm is "full jitter" as described on the AWS Architecture Blog
    ("Exponential Backoff And Jitter"): ``rng.uniform(0, min(cap, base * 2**attempt))``.
    The ceiling doubles per attempt up to ``cap``; the draw spreads contenders
    over the whole window, so they stop retrying in lockstep. Pure: the only
    randomness is the injected ``rng``.

    Args:
        attempt: 0 for the first retry, 1, 2, ... after that.
        base: the first ceiling in seconds (> 0). cap: the largest ceiling (> 0).
        rng: anything with ``uniform(a, b)``, e.g. ``random.Random(seed)``.

    Raises:
        BadArgumentType, BadArgument: naming the argument.

    Example:
        >>> import random
        >>> 0 <= backoff(3, base=0.1, cap=5.0, rng=random.Random(1)) <= 0.8
        True
    """
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        raise BadArgumentType("attempt", f"must be an int, got {type(attempt).__name__}")
    if attempt < 0:
        raise BadArgument("attempt", f"must be >= 0, got {attempt}")
    base = check_number(base, "base", positive=True)
    cap = check_number(cap, "cap", positive=True)
    if not callable(getattr(rng, "uniform", None)):
        raise BadArgumentType("rng", f"must have uniform(a, b), got {type(rng).__name__}")
    try:
        ceiling = min(cap, math.ldexp(base, attempt))
    except OverflowError:
        ceiling = cap
    return rng.uniform(0.0, ceiling)


_VERSION_SCHEMA = """CREATE TABLE version_leases (
    name TEXT PRIMARY KEY, owner TEXT, generation INTEGER NOT NULL,
    version INTEGER NOT NULL, duration REAL NOT NULL)"""


@dataclass(frozen=True, slots=True)
class Seen:
    """A lease record as one contender saw it, and when (on that contender's clock).

    Attributes:
        name: the lease. owner: its holder, or None when free.
        generation: the fencing token of the holder's claim (0 before any claim).
        version: bumped by every claim, heartbeat and release.
        duration: the lease duration stored in the record (s).
        seen_at: the observer's local monotonic time of the observation.
    """

    name: str
    owner: str | None
    generation: int
    version: int
    duration: float
    seen_at: float


class VersionLease:
    """The version-wait protocol: claim only after a whole unchanged lease duration.

    A holder keeps its claim alive by :meth:`heartbeat`, which bumps the version.
    A contender :meth:`observe` s the record, waits the record's ``duration``
    on its OWN monotonic clock, and :meth:`claim` s with one conditional
    ``UPDATE ... WHERE version = :seen``. No clock reading is ever compared with
    another host's: only a local elapsed time, so an offset between the clocks
    does not matter, but their rates do: it assumes bounded drift (the
    contender's wait of one duration must not end before the holder's has).
    It also assumes the holder notices its own lapse within a duration; a
    paused holder does not, so its writes still need the fence (the claim's
    ``generation`` is the token).

    Example:
        >>> from labkit import connect, VirtualClock
        >>> clock = VirtualClock(); leases = VersionLease(connect(), clock)
        >>> a = leases.claim(leases.observe("job"), "A", duration=10)
        >>> seen = leases.observe("job"); _ = clock.advance(10)
        >>> leases.claim(seen, "B", duration=10).generation
        2
    """

    def __init__(self, db, clock: Clock) -> None:
        self.db, self.clock = db, check_clock(clock)
        ensure_schema(db, "version_leases", _VERSION_SCHEMA)

    def observe(self, name: str) -> Seen:
        """Read the record of ``name`` (creating a free one) and stamp it with the local time."""
        name = check_name(name, "name")
        ensure(
            self.db,
            "SELECT 1 FROM version_leases WHERE name = ?",
            (name,),
            "INSERT INTO version_leases VALUES (?, NULL, 0, 0, 0) ON CONFLICT(name) DO NOTHING",
            (name,),
        )
        rows = execute(
            self.db,
            "SELECT owner, generation, version, duration FROM version_leases WHERE name = ?",
            (name,),
        )
        return Seen(name, *rows[0], seen_at=read_clock(self.clock))

    def waited(self, seen: Seen) -> float:
        """How long (local seconds) the observer has waited since ``seen``."""
        return read_clock(self.clock) - seen.seen_at

    def ready(self, seen: Seen) -> bool:
        """True if the record was free, or a full stored duration has passed locally since ``seen``."""
        return seen.owner is None or self.waited(seen) >= seen.duration

    def claim(self, seen: Seen, owner: str, *, duration: float) -> Seen | None:
        """Claim the lease if its version is still ``seen.version``; return the new record or None.

        Raises:
            BadArgument: ``seen`` was held and the full duration has not passed (nothing written).
        """
        owner, duration = (
            check_name(owner, "owner"),
            check_number(duration, "duration", positive=True),
        )
        if not isinstance(seen, Seen):
            raise BadArgumentType("seen", f"must be a Seen, got {type(seen).__name__}")
        if not self.ready(seen):
            raise BadArgument(
                "seen", f"waited {self.waited(seen):g} s of the record's {seen.duration:g} s"
            )
        with transaction(self.db):
            rows = execute(
                self.db,
                """
                UPDATE version_leases SET owner = :owner, generation = generation + 1,
                    version = version + 1, duration = :duration
                WHERE name = :name AND version = :seen
                RETURNING generation, version""",
                {"owner": owner, "duration": duration, "name": seen.name, "seen": seen.version},
            )
        if not rows:
            return None
        return Seen(seen.name, owner, rows[0][0], rows[0][1], duration, read_clock(self.clock))

    def heartbeat(self, mine: Seen) -> Seen | None:
        """Bump the version if ``mine`` (owner and generation) still holds it; None if not.

        Raises:
            BadArgumentType: ``mine`` is not a held :class:`Seen` (nothing written).
        """
        return self._update(_mine(mine), "version = version + 1", mine.owner)

    def release(self, mine: Seen) -> bool:
        """Free the record if ``mine`` still holds it (owner and generation match).

        Raises:
            BadArgumentType: ``mine`` is not a held :class:`Seen` (nothing written).
        """
        return self._update(_mine(mine), "owner = NULL, version = version + 1", None) is not None

    def _update(self, mine: Seen, assignment: str, owner) -> Seen | None:
        with transaction(self.db):
            rows = execute(
                self.db,
                f"UPDATE version_leases SET {assignment} "
                "WHERE name = ? AND owner = ? AND generation = ? RETURNING version",
                (mine.name, mine.owner, mine.generation),
            )
        if not rows:
            return None
        return Seen(
            mine.name, owner, mine.generation, rows[0][0], mine.duration, read_clock(self.clock)
        )

    def __repr__(self) -> str:
        return f"VersionLease(clock={self.clock!r})"


def _mine(mine) -> Seen:
    if not isinstance(mine, Seen) or mine.owner is None:
        raise BadArgumentType(
            "mine", f"must be the Seen returned by claim() or heartbeat(), got {mine!r}"[:120]
        )
    return mine
