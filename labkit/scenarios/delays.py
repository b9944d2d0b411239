"""Lessons 05-06: a message that arrives late, and a holder that believes it.

:func:`late_renewal`: a renewal's answer spends time in the network, so a
holder counting its lease from the answer's arrival acts after the
authority let its successor in (protected by
:class:`~labkit.mechanisms.timing.LeaseKeeper`, counting from the send time).
:func:`late_release`: a release request delayed past the lease's expiry
deletes the successor's lease unless the release checks owner AND
generation. Import them from :mod:`labkit.scenarios`.

Example:
    >>> from labkit.scenarios import late_release
    >>> late_release(protected=False).verdict
    "A's release (generation 7) deleted B's lease (generation 8): foreign release"
    >>> late_release().violations
    ()
"""

from __future__ import annotations

from labkit.db import execute, transaction
from labkit.lease import LeaseAuthority
from labkit.sim.engine import scenario
from labkit.sim.steps import (
    acquire_token,
    amount,
    release_with_token,
    with_tokens,
    write_with_token,
)
from labkit.mechanisms.timing import LeaseKeeper
from labkit.sim.worker import LEASE
from labkit.errors import check_number

__all__ = ["late_renewal", "late_release"]

INVOICES = ("INV-1", "INV-2", "INV-3")


@scenario
def late_renewal(
    sim,
    *,
    protected,
    request_latency=2.0,
    response_latency=3.0,
    margin=1.0,
    drift=0.0,
    offset=0.0,
    ttl=10.0,
):
    """Lesson 05: a renewal answer spends time in the network; counting from its arrival acts too long.

    A acquires, then updates the three invoices once a second, and renews once.
    B compares the lease record's expiry (the authority's clock) against its
    own wall clock, ``offset`` s ahead, and takes over as soon as it reads
    expired. Unprotected, A counts a full ``ttl`` from each answer's ARRIVAL
    and writes without the fence: it keeps writing after the authority let B
    in. Protected, a :class:`~labkit.mechanisms.timing.LeaseKeeper` counts from each
    request's SEND time on A's clock, minus ``margin`` and the offset bound,
    corrected for ``drift``; writes also go through the fence.

    Knobs:
        request_latency, response_latency: one-way delays to and from the authority (s).
        margin: the keeper's explicit margin (s).
        drift: how much slower A's clock runs (fraction, 0 .. 0.5).
        offset: how far B's clock runs ahead of the authority's (s).
        ttl: the lease's length (s).
    """
    margin, offset = check_number(margin, "margin"), check_number(offset, "offset")
    drift = check_number(drift, "drift", high=0.5)
    ttl = check_number(ttl, "ttl", positive=True)
    a = sim.worker(
        "A", request_latency=request_latency, response_latency=response_latency, drift=-drift
    )
    keeper = LeaseKeeper(
        sim.authority, LEASE, "A", ttl=ttl, margin=margin + offset, max_drift=drift, clock=a.clock
    )
    state = {"naive": -1.0, "pending": True}

    def granted(w, lease, sent):
        if lease is None:
            keeper.lost()
            state["naive"] = -1.0
        else:
            keeper.confirm(lease, sent)
            state["naive"] = w.clock.now() + ttl  # a full lease from the answer's arrival

    def renewer(w):
        yield w.env.timeout(0.3 * ttl)
        sent = w.clock.now()
        granted(w, (yield from w.renew(keeper.lease)), sent)
        state["pending"] = False

    def run_a(w):
        sent = w.clock.now()
        lease = yield from w.acquire(ttl)
        granted(w, lease, sent)
        if lease is None:
            return
        w.env.process(renewer(w))
        for k in range(int(4 * ttl)):
            while not (keeper.may_act() if protected else w.clock.now() < state["naive"]):
                if not state["pending"]:
                    return  # no renewal coming: stop for good
                yield w.env.timeout(w.sim.tick)
            yield from write_with_token(
                w, INVOICES[k % 3], amount(w, 100), lease.generation, fenced=protected
            )
            yield w.env.timeout(1.0)

    def run_b(w):
        own_view = LeaseAuthority(sim.database("authority"), w.clock)
        lease, token = yield from acquire_token(w, ttl, authority=own_view)
        if protected:
            yield from w.raise_fence(token)
        w.read(list(INVOICES))
        for invoice in INVOICES:
            yield w.env.timeout(1.0)
            yield from write_with_token(w, invoice, amount(w, 200), token, fenced=protected)
        release_with_token(w, lease, token, authority=own_view)

    with_tokens(sim)
    sim.start(a, run_a)
    sim.start(sim.worker("B", offset=offset), run_b, at=float(request_latency) + 1.0)


@scenario
def late_release(sim, *, protected, delay=12.0, ttl=10.0):
    """Lesson 06: a late release from A deletes B's lease unless it checks owner AND generation.

    A and B run on the same host and use its name, ``host-1``, as owner id (B
    is A's replacement process). A finishes at t=2 and sends its release; the
    request is delayed ``delay`` s. Meanwhile A's lease expires and B acquires
    (8). Unprotected, the release arriving late is ``DELETE ... WHERE name AND
    owner``: it deletes B's lease, and C (``host-2``) gets the lease while B
    still works. Protected, labkit's release also requires generation 7 and is refused.

    Knobs:
        delay: how long A's release request is in flight (s). ttl: the lease's length (s).
    """
    delay, ttl = check_number(delay, "delay"), check_number(ttl, "ttl", positive=True)

    def release_a(w, lease):
        if protected:
            return release_with_token(w, lease, lease.generation)
        with transaction(sim.database("authority")) as conn:
            gone = execute(
                conn,
                "DELETE FROM leases WHERE name = ? AND owner = ? RETURNING name",
                (lease.name, lease.owner),
            )
        w.record("release", "ok" if gone else "lost", generation=lease.generation, target=LEASE)
        return bool(gone)

    def run_a(w):
        lease, token = yield from acquire_token(w, ttl, owner="host-1")
        yield w.env.timeout(1.0)
        yield from write_with_token(w, "INV-1", amount(w, 100), token, fenced=True)
        yield w.env.timeout(1.0 + delay)  # the release request in flight
        release_a(w, lease)

    def run_worker(w, owner, invoices):
        lease, token = yield from acquire_token(w, ttl, owner=owner, poll=1.0)
        yield from w.raise_fence(token)
        w.read(list(invoices))
        for invoice in invoices:
            yield w.env.timeout(1.0)
            if (
                yield from write_with_token(w, invoice, amount(w, 200), token, fenced=True)
            ) != "ok":
                break
        release_with_token(w, lease, token)

    with_tokens(sim)
    sim.start(sim.worker("A"), run_a)
    sim.start(sim.worker("B"), run_worker, "host-1", ("INV-1", "INV-2", "INV-3", "INV-4", "INV-5"))
    sim.start(sim.worker("C"), run_worker, "host-2", ("INV-1", "INV-2", "INV-3"), at=3.5)
