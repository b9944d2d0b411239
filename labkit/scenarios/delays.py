"""Lessons 05-06: a message that arrives late, and a holder that believes it.

>>> late_release(protected=False).verdict
"A's release (generation 7) deleted B's lease (generation 8): foreign release"
"""

from labkit.db import execute, transaction
from labkit.errors import check_number
from labkit.lease import LeaseAuthority
from labkit.sim.engine import scenario
from labkit.sim.steps import acquire_token, amount, release_with_token, with_tokens, write_each
from labkit.mechanisms.timing import LeaseKeeper
from labkit.sim.worker import LEASE

__all__ = ["late_renewal", "late_release"]


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
    """Lesson 05: a lease counted from a late answer's arrival runs too long; count from sending."""
    drift = check_number(drift, "drift", high=0.5)
    invoices = ("INV-1", "INV-2", "INV-3")
    latency = {"request_latency": request_latency, "response_latency": response_latency}
    a = sim.worker("A", drift=-drift, **latency)
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
            state["naive"] = w.clock.now() + ttl - margin  # from the answer's arrival

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
        token = lease.generation
        for k in range(int(4 * ttl)):
            while not (keeper.may_act() if protected else w.clock.now() < state["naive"]):
                if not state["pending"]:
                    return  # no renewal coming: stop for good
                yield w.env.timeout(w.sim.tick)
            yield from w.write(invoices[k % 3], amount(w, 100), token, fenced=protected)
            yield w.env.timeout(1.0)

    def run_b(w):
        own_view = LeaseAuthority(sim.database("authority"), w.clock)
        lease, token = yield from acquire_token(w, ttl, authority=own_view)
        if protected:
            yield from w.raise_fence(token)
        yield from write_each(w, invoices, token, fenced=protected)
        release_with_token(w, lease, token, authority=own_view)

    with_tokens(sim)
    sim.start(a, run_a)
    sim.start(sim.worker("B", offset=offset), run_b, at=float(request_latency) + 1.0)


@scenario
def late_release(sim, *, protected, delay=12.0, ttl=10.0):
    """Lesson 06: A's late release deletes B's lease unless it checks owner AND generation."""

    def run_a(w):
        lease, token = yield from acquire_token(w, ttl, owner="host-1")
        yield w.env.timeout(1.0)
        yield from w.write("INV-1", amount(w, 100), token, fenced=True)
        yield w.env.timeout(1.0 + delay)  # the release request in flight
        if protected:
            release_with_token(w, lease, token)
            return
        naive = "DELETE FROM leases WHERE name = $1 AND owner = $2 RETURNING name"  # no generation
        with transaction(sim.database("authority")) as conn:
            gone = execute(conn, naive, (lease.name, lease.owner))
        w.record("release", "ok" if gone else "lost", generation=token, target=LEASE)

    def run_worker(w, owner, invoices):
        lease, token = yield from acquire_token(w, ttl, owner=owner, poll=1.0)
        yield from w.raise_fence(token)
        yield from write_each(w, invoices, token, fenced=True)
        release_with_token(w, lease, token)

    with_tokens(sim)
    sim.start(sim.worker("A"), run_a)
    sim.start(sim.worker("B"), run_worker, "host-1", ("INV-1", "INV-2", "INV-3", "INV-4", "INV-5"))
    sim.start(sim.worker("C"), run_worker, "host-2", ("INV-1", "INV-2", "INV-3"), at=3.5)
