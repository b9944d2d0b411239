"""The course's failures, one function each, replayed on the engine in :mod:`labkit.sim`.

Every scenario has the form ``f(*, protected=True, seed=0, **knobs) -> Result``.
``protected=False`` runs the naive variant a lesson warns about; the defaults
are the source's numbers: a 10 s lease, a 30 s pause, six earlier holders, so
the stale worker A holds generation 7 and its successor B generation 8.
``SCENARIOS`` maps every scenario's name to the function.

Example:
    >>> from labkit.scenarios import expired_but_alive
    >>> expired_but_alive(protected=False).kinds >= {"lost_update", "stale_accepted"}
    True
    >>> expired_but_alive().violations
    ()
"""

from __future__ import annotations

from .sim import SCENARIOS, Result, check_knob, scenario

__all__ = ["expired_but_alive", "SCENARIOS", "Result"]


def _amount(w, base: int) -> int:
    """An invoice amount that depends on the seed (so the seed slider changes the tables)."""
    return base + 5 * w.sim.rng.randrange(0, 10)


def _work(w) -> float:
    """How long one invoice takes to prepare: 1, 1.5 or 2 s, drawn from the seeded rng."""
    return w.sim.rng.choice((1.0, 1.5, 2.0))


@scenario
def expired_but_alive(sim, *, protected, pause=30.0, ttl=10.0):
    """Lesson 01: A's lease expires while A is paused; B takes over; A wakes up and writes.

    A acquires (generation 7), reads the invoice state and pauses ``pause`` s.
    B polls the authority, acquires once A's lease has expired (generation 8)
    and completes the invoice run (INV-1, INV-2). A resumes and writes INV-1
    with what it read before the pause. Unprotected, A's upsert overwrites B's
    invoice; protected, every write goes through the fence and A's 7 bounces.

    Knobs:
        pause: how long A stops after reading (s).
        ttl: the lease's length (s).
    """
    pause, ttl = check_knob(pause, "pause"), check_knob(ttl, "ttl", positive=True)
    a = sim.worker("A", pauses={"after-read": pause})
    b = sim.worker("B")

    def run_a(w):
        lease = yield from w.acquire(ttl)
        w.read(["INV-1"])
        yield from w.point("after-read")
        yield from w.write("INV-1", _amount(w, 100), lease.generation, fenced=protected)
        yield from w.release(lease)

    def run_b(w):
        lease = yield from w.acquire_when_free(ttl, poll=2.0)
        w.read(["INV-1", "INV-2"])
        for invoice in ("INV-1", "INV-2"):
            yield w.env.timeout(_work(w))
            yield from w.write(invoice, _amount(w, 200), lease.generation, fenced=protected)
        yield from w.release(lease)

    sim.start(a, run_a)
    sim.start(b, run_b)
