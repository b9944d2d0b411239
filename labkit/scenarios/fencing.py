"""Lessons 01-03: fencing tokens, and the ways to get them wrong.

>>> same_generation_duplicate().verdict
"B's repeat of 'bill/order-42' was recognised by its key: it took effect once"
"""

import contextlib

from labkit.db import execute, transaction
from labkit.errors import check_number
from labkit.fence import Fence
from labkit.idempotency import run_once
from labkit.sim.engine import scenario
from labkit.sim.steps import amount, work
from labkit.sim.worker import JOB, NoResponse, upsert_invoice

__all__ = ["expired_but_alive", "raise_then_read", "check_then_act", "split_databases"]
__all__ += ["bypass_writer", "lock_wait", "same_generation_duplicate"]


def _successor(w, ttl, *, raise_first, fenced, invoices=("INV-1", "INV-2"), gap=None):
    """B: wait for the lease; if ``raise_first`` raise the fence (and keep the lease before each
    write); read, then write each invoice."""
    lease = yield from w.acquire_when_free(ttl)
    if raise_first:
        yield from w.raise_fence(lease.generation)
    w.read(invoices)
    for invoice in invoices:
        yield w.env.timeout(work(w) if gap is None else gap)
        if raise_first and (lease := (yield from w.keep(lease, invoice))) is None:
            return
        yield from w.write(invoice, amount(w, 200), lease.generation, fenced=fenced)
    yield from w.release(lease)


def _stale_writer(w, ttl, *, fenced, invoices=("INV-1",)):
    """A: acquire, read, stop at ``after-read``, then write each invoice 1 s apart."""
    lease = yield from w.acquire(ttl)
    w.read(invoices)
    yield from w.point("after-read")
    for i, invoice in enumerate(invoices):
        if i:
            yield w.env.timeout(1.0)
        yield from w.write(invoice, amount(w, 100), lease.generation, fenced=fenced[i])
    yield from w.release(lease)


@scenario
def expired_but_alive(sim, *, protected, pause=30.0, ttl=10.0):
    """Lesson 01: A's lease expires while A is paused and A writes on waking; the fence stops it."""
    sim.start(sim.worker("A", pauses={"after-read": pause}), _stale_writer, ttl, fenced=[protected])
    sim.start(sim.worker("B"), _successor, ttl, raise_first=protected, fenced=protected)


@scenario
def raise_then_read(sim, *, protected, gap=5.0, pause=12.0, ttl=10.0):
    """Lesson 02: B must raise the fence before it reads, or A's late write lands in B's ``gap``."""
    sim.start(sim.worker("A", pauses={"after-read": pause}), _stale_writer, ttl, fenced=[True])
    b = sim.worker("B")
    sim.start(b, _successor, ttl, raise_first=protected, fenced=True, invoices=["INV-1"], gap=gap)


@scenario
def check_then_act(sim, *, protected, gap=5.0, ttl=10.0):
    """Lesson 03: A checks the fence in Python, then writes unconditionally; ``guard`` stops it."""

    def run_a(w):
        lease = yield from w.acquire(ttl)
        w.read(["INV-1"])
        yield w.env.timeout(min(8.0, 0.8 * ttl))
        current = Fence(w.db, JOB).current()
        w.record("read", "ok", target="fence", generation=current)
        g = lease.generation
        if g < current:  # the check, in Python
            return
        yield w.env.timeout(gap)  # ... the window ...
        if protected:
            yield from w.write("INV-1", amount(w, 100), g)
        else:
            yield from w.wait_for_lock()
            with transaction(w.db) as conn:  # no condition: whatever the fence says now
                execute(conn, "UPDATE job_fence SET generation = $1 WHERE job_id = $2", (g, JOB))
                upsert_invoice(conn, "INV-1", amount(w, 100), g)
            w.record("raise", "ok", generation=g, target=JOB)
            w.record("write", "ok", generation=g, target="INV-1")
        yield from w.release(lease)

    sim.start(sim.worker("A"), run_a)
    sim.start(sim.worker("B"), _successor, ttl, raise_first=True, fenced=True, invoices=["INV-1"])


@scenario
def split_databases(sim, *, protected, pause=30.0, ttl=10.0):
    """Lesson 03: the fence in ``fence.db``, the invoices in ``resource.db``: one file stops it."""
    if not protected:
        sim.layout["job_fence"] = "fence"
        Fence(sim.database("fence"), JOB)

    def fenced_write(w, invoice, amount, generation):
        if protected:
            return (yield from w.write(invoice, amount, generation, inside="between", read=True))
        if not (yield from w.raise_fence(generation, db="fence")):
            return w.record("write", "rejected", generation=generation, target=invoice).outcome
        yield from w.point("between")
        return (yield from w.write(invoice, amount, generation, fenced=False, read=True))

    def run(w, invoices, base, first=False):
        lease = yield from (w.acquire(ttl) if first else w.acquire_when_free(ttl))
        for invoice in invoices:
            yield w.env.timeout(1.0 if first else work(w))
            if protected and (lease := (yield from w.keep(lease, invoice))) is None:
                return  # its lease ended while it waited: no more work, nothing to release
            yield from fenced_write(w, invoice, amount(w, base), lease.generation)
        yield from w.release(lease)

    sim.start(sim.worker("A", pauses={"between": pause}), run, ["INV-1"], 100, first=True)
    sim.start(sim.worker("B"), run, ["INV-1", "INV-2"], 200)


@scenario
def bypass_writer(sim, *, protected, pause=30.0, ttl=10.0):
    """Lesson 03: an export script that skips the fence lets A's stale INV-2 land over B's."""
    a = sim.worker("A", pauses={"after-read": pause})
    sim.start(a, _stale_writer, ttl, fenced=[True, protected], invoices=["INV-1", "INV-2"])
    sim.start(sim.worker("B"), _successor, ttl, raise_first=True, fenced=True)


@scenario
def lock_wait(sim, *, protected, hold=30.0, ttl=10.0):
    """Lesson 02: A stops inside its write, holding SQLite's file lock; B waits, then renews.
    Protected, each worker renews before more protected work and stops if refused."""

    def step(w, lease, invoice, base, read=True):
        if protected and (lease := (yield from w.keep(lease, invoice))) is None:
            return None  # the lease ended: no more work, nothing to release
        yield from w.write(invoice, amount(w, base), lease.generation, fenced=protected, read=read)
        return lease

    def run_a(w):
        lease = yield from w.acquire(ttl)
        for invoice, wait in (("INV-1", 2.0), ("INV-2", 1.0)):
            yield w.env.timeout(wait)
            if (lease := (yield from step(w, lease, invoice, 100))) is None:
                return
        yield from w.release(lease)

    def run_b(w):
        lease = yield from w.acquire_when_free(ttl)
        if (lease := (yield from step(w, lease, "INV-1", 200))) is None:
            return
        w.read(["INV-2"])
        yield w.env.timeout(work(w))
        if (lease := (yield from step(w, lease, "INV-2", 200, read=False))) is not None:
            yield from w.release(lease)

    sim.start(sim.worker("A", pauses={"inside-write": hold}), run_a)
    sim.start(sim.worker("B"), run_b)


@scenario
def same_generation_duplicate(sim, *, protected, repeats=2, ttl=10.0):
    """Lesson 02: equal generations pass the fence, so B's repeated step needs a key."""
    repeats = check_number(repeats, "repeats", integer=True, low=1, high=20)
    key = "bill/order-42"

    def run_a(w):
        lease = yield from w.acquire(ttl)
        yield w.env.timeout(1.0)
        yield from w.write("INV-1", amount(w, 100), lease.generation)
        yield from w.release(lease)

    def bill(w, generation):
        made = []

        def effect(tx):
            n = tx.execute("SELECT count(*) FROM invoices WHERE job_id = $1", (JOB,))[0][0]
            made.append(f"INV-{n + 1}")
            upsert_invoice(tx.conn, made[-1], 420, generation)
            return made[-1]

        yield from w.wait_for_lock()
        with w.fence().guard(generation) as tx:
            invoice = run_once(tx, key, effect, payload={"order": 42}) if protected else effect(tx)
        w.record("raise", "ok", generation=generation, target=JOB)
        outcome = "ok" if made else "duplicate"
        w.record("write", outcome, generation=generation, key=key, target=invoice)

    def run_b(w):
        lease = yield from w.acquire_when_free(ttl, poll=1.0)
        yield from w.raise_fence(lease.generation)
        for _ in range(repeats):
            yield w.env.timeout(work(w))
            yield from bill(w, lease.generation)
            with contextlib.suppress(NoResponse):  # a lost acknowledgement: send the step again
                yield from w.reply("write")
                break
        yield from w.release(lease)

    sim.start(sim.worker("A"), run_a)
    sim.start(sim.worker("B", lose=["write"] * (repeats - 1), timeout=3.0), run_b, at=0.5)
