"""Lesson 07: a worker raises the fence and crashes; who finishes its work, repeating none of it?

>>> sorted(crash_after_fence(protected=False).kinds), crash_after_fence().violations
(['duplicate_effect'], ())
"""

from labkit.db import execute, transaction
from labkit.errors import LeaseLost, StaleGeneration, check_number
from labkit.mechanisms.recovery import Claims, operation_key, produce
from labkit.sim.engine import scenario
from labkit.sim.worker import JOB

__all__ = ["crash_after_fence"]


@scenario
def crash_after_fence(
    sim, *, protected, crash_after=0, invoices=3, pause=30.0, ttl=10.0, sweep_every=5.0
):
    """Lesson 07: B raises the fence and crashes; checkpoints and keys bill each customer once."""
    units = check_number(invoices, "invoices", integer=True, low=1, high=20)
    crash_after = check_number(crash_after, "crash_after", integer=True, high=units)
    sweep_every = check_number(sweep_every, "sweep_every", positive=True)
    customers = [f"c{i + 1}" for i in range(units)]
    Claims(sim.database("resource"), sim.clock).enqueue(JOB)
    sim.layout.update({"claims": "resource"})

    def bill(w, claim, unit):
        g, key, invoice = claim.generation, operation_key(JOB, unit), f"{unit}@{claim.generation}"
        yield from w.wait_for_lock(target=invoice)
        try:
            if protected:
                outcome = "ok" if produce(w.fence(), claim, unit, 100) else "duplicate"
            else:
                with w.fence().guard(g) as tx:
                    tx.execute(
                        "INSERT INTO invoices VALUES ($1, $2, $3, $4)", (JOB, invoice, 100, g)
                    )
                outcome = "ok"
        except StaleGeneration:
            return w.record("write", "rejected", generation=g, key=key, target=invoice).outcome
        w.record("raise", generation=g, target=JOB)
        return w.record("write", outcome, generation=g, key=key, target=invoice).outcome

    def renewed(w, lease):
        """``lease``, renewed first when less than 3 s are left: None once it is lost."""
        return (yield from w.renew(lease)) if lease.expires_at - w.env.now < 3.0 else lease

    def run(w, crash=None):
        claims = Claims(w.db, sim.clock)
        lease = yield from w.acquire_when_free(ttl)
        while (claim := (yield from w.locked(claims.claim, JOB, w.name, lease.generation))) is None:
            if claims.get(JOB).state == "done":
                return
            yield w.env.timeout(1.0)  # wait for the job to be claimable, keeping the lease
            if (lease := (yield from renewed(w, lease))) is None:
                return
        if not (yield from w.raise_fence(claim.generation)):
            return
        billed = 0
        for i in range(claim.progress if protected else 0, units):
            if billed == crash:
                yield from w.point("crash")
            if (lease := (yield from renewed(w, lease))) is None:
                return
            yield w.env.timeout(1.0)
            yield from w.point(f"before-{customers[i]}")
            if (yield from bill(w, claim, customers[i])) == "rejected":
                return
            billed += 1
            if protected:
                if billed == crash:
                    yield from w.point("crash")  # after the invoice, before its checkpoint
                try:
                    claim = yield from w.locked(claims.checkpoint, claim, i + 1)
                except LeaseLost:
                    return
        yield from (w.locked(claims.finish, claim) if protected else w.locked(_naive_finish, w.db))
        yield from w.release(lease)

    def sweeper(w):
        claims = Claims(w.db, sim.clock)
        while sim.env.now < pause + 6 * ttl and claims.get(JOB).state != "done":
            if protected:
                for seen in claims.stale(older_than=ttl):
                    if (yield from w.locked(claims.requeue, seen)):
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
    """The known-wrong sweeper: requeue every claim older than ``cutoff``, by age alone."""
    sql = """UPDATE claims SET owner = NULL, state = 'queued', version = version + 1
             WHERE state = 'claimed' AND updated_at <= $1 RETURNING generation"""
    with transaction(db):
        return execute(db, sql, (cutoff,))


def _naive_finish(db) -> None:
    with transaction(db):
        execute(
            db, "UPDATE claims SET state = 'done', version = version + 1 WHERE job = $1", (JOB,)
        )
