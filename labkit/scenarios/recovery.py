"""Lesson 07: a worker raises the fence and crashes; who finishes its work, exactly once?

:func:`crash_after_fence` bills customers under a durable claim
(:class:`~labkit.mechanisms.recovery.Claims`): protected by progress checkpoints, a
conditional requeue and operation ids (:func:`~labkit.mechanisms.recovery.produce`).
Import it from :mod:`labkit.scenarios`.

Example:
    >>> from labkit.scenarios import crash_after_fence
    >>> sorted(crash_after_fence(protected=False).kinds)
    ['duplicate_effect']
    >>> crash_after_fence().violations
    ()
"""

from __future__ import annotations

from labkit.db import execute, transaction
from labkit.errors import LeaseLost, StaleGeneration
from labkit.mechanisms.recovery import Claims, operation_key, produce
from labkit.sim.engine import scenario
from labkit.sim.worker import JOB
from labkit.errors import check_number

__all__ = ["crash_after_fence"]


@scenario
def crash_after_fence(
    sim, *, protected, crash_after=0, invoices=3, pause=30.0, ttl=10.0, sweep_every=5.0
):
    """Lesson 07: B raises the fence and crashes; who notices the unfinished work, and who repeats it?

    The job bills customers c1 .. c``invoices``, one invoice each, tracked in a
    durable ``claims`` row. A (7) bills c1 and pauses ``pause`` s. B (8)
    takes the lease and the requeued job, raises the fence, bills
    ``crash_after`` customers and crashes before its next checkpoint. C (9)
    takes over when B's lease lapses. A sweeper requeues stale claims every
    ``sweep_every`` s. Unprotected: no progress is recorded, the sweeper
    requeues by age alone and a retry starts from c1 without operation ids, so
    c1 is billed twice. Protected: progress checkpoints, a conditional requeue
    (:meth:`~labkit.mechanisms.recovery.Claims.sweep`) and :func:`~labkit.mechanisms.recovery.produce`
    with operation ids: every customer billed exactly once.

    Knobs:
        crash_after: customers B bills before crashing (0: right after raising the fence).
        invoices: customers in the job (1 .. 20). pause: A's stop after its first invoice (s).
        ttl: the lease's length (s). sweep_every: the sweeper's period (s); a claim is stale after ``ttl`` s.
    """
    units = check_number(invoices, "invoices", integer=True, low=1, high=20)
    crash_after = check_number(crash_after, "crash_after", integer=True, high=units)
    pause, ttl = check_number(pause, "pause"), check_number(ttl, "ttl", positive=True)
    sweep_every = check_number(sweep_every, "sweep_every", positive=True)
    customers = [f"c{i + 1}" for i in range(units)]
    Claims(sim.database("resource"), sim.clock).enqueue(JOB)
    sim.layout.update({"claims": "resource"})

    def claims_of(w):
        return Claims(w.db, sim.clock)

    def done(w) -> bool:
        return claims_of(w).get(JOB).state == "done"

    def bill(w, claim, unit):
        key = operation_key(JOB, unit)
        invoice = f"{unit}@{claim.generation}"
        yield from w.wait_for_lock(target=invoice)
        try:
            if protected:
                fresh = produce(w.fence(), claim, unit, 100)
            else:
                with w.fence().guard(claim.generation) as tx:
                    tx.execute(
                        "INSERT INTO invoices VALUES (?, ?, ?, ?)",
                        (JOB, invoice, 100, claim.generation),
                    )
                fresh = True
        except StaleGeneration:
            return w.record(
                "write", "rejected", generation=claim.generation, key=key, target=invoice
            ).outcome
        w.record("raise", generation=claim.generation, target=JOB)
        return w.record(
            "write",
            "ok" if fresh else "duplicate",
            generation=claim.generation,
            key=key,
            target=invoice,
        ).outcome

    def run(w, crash=None):
        lease = yield from w.acquire_when_free(ttl)
        while True:  # wait for the job to be claimable, keeping the lease
            claim = yield from w.locked(claims_of(w).claim, JOB, w.name, lease.generation)
            if claim is not None or done(w):
                break
            yield w.env.timeout(1.0)
            if (
                lease.expires_at - w.env.now < 3.0
                and (lease := (yield from w.renew(lease))) is None
            ):
                return
        if claim is None:
            return
        if not (yield from w.raise_fence(claim.generation)):
            return
        billed = 0
        for i in range(claim.progress if protected else 0, units):
            if crash is not None and billed == crash:
                yield from w.point("crash")
            if (
                lease.expires_at - w.env.now < 3.0
                and (lease := (yield from w.renew(lease))) is None
            ):
                return
            yield w.env.timeout(1.0)
            yield from w.point(f"before-{customers[i]}")
            if (yield from bill(w, claim, customers[i])) == "rejected":
                return
            billed += 1
            if protected:
                if crash is not None and billed == crash:
                    yield from w.point("crash")  # after the invoice, before its checkpoint
                try:
                    claim = yield from w.locked(claims_of(w).checkpoint, claim, i + 1)
                except LeaseLost:
                    return
        if protected:
            yield from w.locked(claims_of(w).finish, claim)
        else:
            yield from w.locked(_naive_finish, w.db)
        yield from w.release(lease)

    def sweeper(w):
        while sim.env.now < pause + 6 * ttl and not done(w):
            if protected:
                for seen in claims_of(w).stale(older_than=ttl):
                    if (yield from w.locked(claims_of(w).requeue, seen)):
                        w.record("sweep", generation=seen.generation, target=JOB)
            else:
                for (generation,) in (yield from w.locked(_naive_requeue, w.db, sim.env.now - ttl)):
                    w.record("sweep", generation=generation, target=JOB)
            yield sim.env.timeout(sweep_every)

    sim.start(sim.worker("A", pauses={"before-c2": pause}), run)
    sim.start(sim.worker("B", crash_at="crash"), run, crash_after, at=0.5)
    sim.start(sim.worker("C"), run, at=12.0)
    sim.start(sim.worker("sweeper"), sweeper)


def _naive_requeue(db, cutoff: float) -> list[tuple]:
    """The known-wrong sweeper: requeue every claim older than ``cutoff``, by age alone, in one go."""
    with transaction(db):
        return execute(
            db,
            "UPDATE claims SET owner = NULL, state = 'queued', version = version + 1 "
            "WHERE state = 'claimed' AND updated_at <= ? RETURNING generation",
            (cutoff,),
        )


def _naive_finish(db) -> None:
    with transaction(db):
        execute(db, "UPDATE claims SET state = 'done', version = version + 1 WHERE job = ?", (JOB,))
