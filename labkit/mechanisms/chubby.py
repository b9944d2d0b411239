"""Chubby's two answers for a resource that cannot keep a fence (lesson 08), on labkit's leases.

Burrows' Chubby lock service (OSDI 2006) offers both, for servers that cannot check a token:

* **lock-delay**: when a holder is lost uncleanly (its lease ran out; it never released), the
  lock is not granted again for ``delay`` seconds, so the lost holder's requests still in flight
  land before anyone else starts. The cost is that time: nobody works. It bounds stragglers
  only up to ``delay``; a later one still lands during the successor's term.
* **sequencer check**: the resource asks the lock service whether the token it was handed is
  still current, just before acting. What remains is the race between that answer and the act.

Written here because no library offers them over labkit's ``LeaseAuthority``: a few lines each.
"""

from __future__ import annotations

from labkit.clock import read_clock
from labkit.db import execute
from labkit.errors import check_number
from labkit.lease import Lease, LeaseAuthority

__all__ = ["LockDelay", "is_current", "straggler"]


class LockDelay:
    """``authority``'s leases with a lock-delay: a lease that expired without a release is not
    granted again until ``delay`` seconds after its expiry (a released one is free at once)."""

    def __init__(self, authority: LeaseAuthority, delay: float) -> None:
        self.authority, self.delay = authority, check_number(delay, "delay")

    def free_at(self, name: str) -> float:
        """When ``name`` may be granted again (``-inf`` if it may now, or nobody held it)."""
        rows = execute(self.authority.db, "SELECT expires_at FROM leases WHERE name = $1", (name,))
        return rows[0][0] + self.delay if rows else float("-inf")

    def try_acquire(self, name: str, owner: str, ttl: float) -> Lease | None:
        """The lease, or None while it is held or inside the lost holder's lock-delay."""
        if read_clock(self.authority.clock) < self.free_at(name):
            return None
        return self.authority.try_acquire(name, owner, ttl)


def is_current(authority: LeaseAuthority, sequencer: Lease) -> bool:
    """The resource's question to the lock service: is ``sequencer`` (name, owner and
    generation) still the lease it holds? True is an answer about now, not about later."""
    held = authority.current(sequencer.name)
    if held is None:
        return False
    return (held.owner, held.generation) == (sequencer.owner, sequencer.generation)


def straggler(delay: float, in_flight: float, *, ttl: float = 10.0) -> dict:
    """A real run on a virtual clock: A (lease ``ttl``) sends its report email at t=5; it takes
    ``in_flight`` s to reach the provider, and A goes silent, never releasing. From A's expiry on,
    B asks every second through a :class:`LockDelay` of ``delay``; once granted, B reads the
    provider's records and sends the email only if none has arrived. Returns the emails the
    provider recorded (``(time, sender)``), when B was granted, and how long nobody worked."""
    from labkit.clock import VirtualClock
    from labkit.db import connect
    from labkit.mechanisms.effects import EmailProvider

    delay, in_flight = check_number(delay, "delay"), check_number(in_flight, "in_flight")
    clock = VirtualClock()
    authority, mail = LeaseAuthority(connect(), clock), EmailProvider(connect(), clock)
    locks, arrives = LockDelay(authority, delay), 5.0 + in_flight
    locks.try_acquire("report", "A", ttl)

    def until(t: float) -> None:  # the clock moves on; A's email lands when its time comes
        nonlocal arrives
        if arrives <= t:
            clock.advance(arrives - clock.now())
            mail.send("ops", "report", "from A", idempotency_key=None)
            arrives = float("inf")
        clock.advance(t - clock.now())

    b, t = None, ttl
    while b is None:
        until(t)
        b, t = locks.try_acquire("report", "B", ttl), t + 1.0
    if not mail.records():  # B finds no email recorded yet: it sends its own
        mail.send("ops", "report", "from B")
    until(max(arrives, clock.now()) if arrives != float("inf") else clock.now())
    sent = [(r["created_at"], r["payload"]["body"][-1]) for r in mail.records()]
    return {"emails": sent, "b_granted": b.expires_at - ttl, "idle": b.expires_at - 2 * ttl}
