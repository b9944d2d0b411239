"""Lessons 01-03: fencing tokens, and the ways to get them wrong.

A paused holder outlives its lease and writes (:func:`expired_but_alive`);
the successor must raise the fence before it reads (:func:`raise_then_read`);
a successor waits on the fence row's lock (:func:`lock_wait`); equal
generations pass the fence, so a repeat needs a key
(:func:`same_generation_duplicate`). Lesson 03's dangerous variants: the check
made in Python (:func:`check_then_act`), the fence in another file
(:func:`split_databases`), one writer that skips it (:func:`bypass_writer`).
Every scenario is ``f(*, protected=True, seed=0, **knobs) -> Result``; import
them from :mod:`labkit.scenarios`.

Example:
    >>> from labkit.scenarios import same_generation_duplicate
    >>> sorted(same_generation_duplicate(protected=False).kinds)
    ['duplicate_effect']
    >>> same_generation_duplicate().verdict
    "B's repeat of 'bill/order-42' was recognised by its key: it took effect once"
"""

from __future__ import annotations

from labkit.db import execute, transaction
from labkit.fence import Fence
from labkit.idempotency import run_once
from labkit.sim.engine import scenario
from labkit.sim.steps import amount, work
from labkit.sim.worker import JOB, NoResponse, upsert_invoice
from labkit.errors import check_number

__all__ = [
    "expired_but_alive",
    "raise_then_read",
    "check_then_act",
    "split_databases",
    "bypass_writer",
    "lock_wait",
    "same_generation_duplicate",
]


def _successor(w, ttl, protected, invoices=("INV-1", "INV-2")):
    """B: wait for the lease, raise the fence (when protected), read, then write each invoice."""
    lease = yield from w.acquire_when_free(ttl)
    if protected:
        yield from w.raise_fence(lease.generation)
    w.read(list(invoices))
    for invoice in invoices:
        yield w.env.timeout(work(w))
        yield from w.write(invoice, amount(w, 200), lease.generation, fenced=protected)
    yield from w.release(lease)


@scenario
def expired_but_alive(sim, *, protected, pause=30.0, ttl=10.0):
    """Lesson 01: A's lease expires while A is paused; B takes over; A wakes up and writes.

    A acquires (generation 7), reads the invoice state and pauses ``pause`` s.
    B acquires as soon as A's lease has expired (generation 8) and completes
    the invoice run (INV-1, INV-2). A resumes and writes INV-1 from what it
    read before the pause. Unprotected, A's upsert overwrites B's invoice;
    protected, every write goes through the fence and A's 7 bounces off 8.

    Knobs:
        pause: how long A stops after reading (s).
        ttl: the lease's length (s).
    """
    pause, ttl = check_number(pause, "pause"), check_number(ttl, "ttl", positive=True)

    def run_a(w):
        lease = yield from w.acquire(ttl)
        w.read(["INV-1"])
        yield from w.point("after-read")
        yield from w.write("INV-1", amount(w, 100), lease.generation, fenced=protected)
        yield from w.release(lease)

    sim.start(sim.worker("A", pauses={"after-read": pause}), run_a)
    sim.start(sim.worker("B"), _successor, ttl, protected)


@scenario
def raise_then_read(sim, *, protected, gap=5.0, pause=12.0, ttl=10.0):
    """Lesson 02: the successor must raise the fence BEFORE reading the state it will modify.

    A (7) pauses ``pause`` s and then writes INV-1 through the fence. B (8)
    acquires at A's expiry, reads INV-1, prepares for ``gap`` s and writes it.
    Protected, B raises the fence first and then reads: A's late write bounces.
    Unprotected, B reads first and raises the fence only with its write: A's
    write lands in the gap, is accepted (the fence is still below 8), and B,
    acting on its older read, overwrites it without ever having seen it.

    Knobs:
        gap: B's time between reading and writing (s).
        pause: when A wakes up and writes (s after it acquired).
        ttl: the lease's length (s).
    """
    gap, pause = check_number(gap, "gap"), check_number(pause, "pause")
    ttl = check_number(ttl, "ttl", positive=True)

    def run_a(w):
        lease = yield from w.acquire(ttl)
        w.read(["INV-1"])
        yield from w.point("after-read")
        yield from w.write("INV-1", amount(w, 100), lease.generation)
        yield from w.release(lease)

    def run_b(w):
        lease = yield from w.acquire_when_free(ttl)
        if protected:
            yield from w.raise_fence(lease.generation)
        w.read(["INV-1"])
        yield w.env.timeout(gap)
        yield from w.write("INV-1", amount(w, 200), lease.generation)
        yield from w.release(lease)

    sim.start(sim.worker("A", pauses={"after-read": pause}), run_a)
    sim.start(sim.worker("B"), run_b)


@scenario
def check_then_act(sim, *, protected, gap=5.0, ttl=10.0):
    """Lesson 03: read the generation, compare it in Python, then write without a condition.

    A (7) works for 8 s, then checks the fence (SELECT: still below 7, fine),
    waits ``gap`` s, and writes INV-1. Unprotected, the write is unconditional
    (an UPSERT and ``UPDATE job_fence SET generation = 7``): if B (8) committed
    in the gap, A overwrites B's invoice and even moves the fence back.
    Protected, A's write is the conditional ``UPDATE ... RETURNING`` of
    ``fence.guard``: the check and the write are one statement, and A bounces.

    Knobs:
        gap: A's time between its check and its write (s).
        ttl: the lease's length (s).
    """
    gap, ttl = check_number(gap, "gap"), check_number(ttl, "ttl", positive=True)

    def run_a(w):
        lease = yield from w.acquire(ttl)
        w.read(["INV-1"])
        yield w.env.timeout(min(8.0, 0.8 * ttl))
        current = Fence(w.db, JOB).current()
        w.record("read", "ok", target="fence", generation=current)
        if lease.generation < current:  # the check, in Python
            return
        yield w.env.timeout(gap)  # ... the window ...
        if protected:
            yield from w.write("INV-1", amount(w, 100), lease.generation)
        else:
            yield from w.wait_for_lock()
            with transaction(w.db) as conn:  # no condition: whatever the fence says now
                execute(
                    conn,
                    "UPDATE job_fence SET generation = ? WHERE job_id = ?",
                    (lease.generation, JOB),
                )
                upsert_invoice(conn, "INV-1", amount(w, 100), lease.generation)
            w.record("raise", "ok", generation=lease.generation, target=JOB)
            w.record("write", "ok", generation=lease.generation, target="INV-1")
        yield from w.release(lease)

    sim.start(sim.worker("A"), run_a)
    sim.start(sim.worker("B"), _successor, ttl, True, ("INV-1",))


@scenario
def split_databases(sim, *, protected, pause=30.0, ttl=10.0):
    """Lesson 03: the fence in one SQLite file, the invoices in another.

    Unprotected, ``job_fence`` lives in ``fence.db`` and ``invoices`` in
    ``resource.db``: A (7) passes the fence (a committed transaction in one
    file), pauses ``pause`` s, then writes INV-1 in a second transaction in the
    other file, which knows nothing about the fence: if B (8) committed
    meanwhile, A overwrites it. Protected, both tables are in one file and the
    fence and the write are one transaction: A's pause holds the write lock,
    B waits for it, raises the fence after A's commit and reads A's invoice.

    Knobs:
        pause: A's stop between passing the fence and writing (s).
        ttl: the lease's length (s).
    """
    pause, ttl = check_number(pause, "pause"), check_number(ttl, "ttl", positive=True)
    if not protected:
        sim.layout["job_fence"] = "fence"
        Fence(sim.database("fence"), JOB)

    def fenced_write(w, invoice, amount, generation, read=False):
        if protected:
            return (yield from w.write(invoice, amount, generation, inside="between", read=read))
        if not (yield from w.raise_fence(generation, db="fence")):
            return w.record("write", "rejected", generation=generation, target=invoice).outcome
        yield from w.point("between")
        return (yield from w.write(invoice, amount, generation, fenced=False, read=read))

    def run_a(w):
        lease = yield from w.acquire(ttl)
        yield w.env.timeout(1.0)
        yield from fenced_write(w, "INV-1", amount(w, 100), lease.generation, read=True)
        yield from w.release(lease)

    def run_b(w):
        lease = yield from w.acquire_when_free(ttl)
        for invoice in ("INV-1", "INV-2"):
            yield w.env.timeout(work(w))
            yield from fenced_write(w, invoice, amount(w, 200), lease.generation, read=True)
        yield from w.release(lease)

    sim.start(sim.worker("A", pauses={"between": pause}), run_a)
    sim.start(sim.worker("B"), run_b)


@scenario
def bypass_writer(sim, *, protected, pause=30.0, ttl=10.0):
    """Lesson 03: one writer that skips the fenced path undoes the guarantee for everyone.

    As in :func:`expired_but_alive`, A (7) pauses past its lease and B (8)
    completes the run. A then writes INV-1 through the fence (it bounces) and
    INV-2 through an old export script that upserts directly (unprotected):
    that write lands on B's invoice. Protected, the script goes through the
    fence too, and both of A's writes bounce.

    Knobs:
        pause: how long A stops after reading (s).
        ttl: the lease's length (s).
    """
    pause, ttl = check_number(pause, "pause"), check_number(ttl, "ttl", positive=True)

    def run_a(w):
        lease = yield from w.acquire(ttl)
        w.read(["INV-1", "INV-2"])
        yield from w.point("after-read")
        yield from w.write("INV-1", amount(w, 100), lease.generation)
        yield w.env.timeout(1.0)
        yield from w.write("INV-2", amount(w, 100), lease.generation, fenced=protected)
        yield from w.release(lease)

    sim.start(sim.worker("A", pauses={"after-read": pause}), run_a)
    sim.start(sim.worker("B"), _successor, ttl, True)


@scenario
def lock_wait(sim, *, protected, hold=30.0, ttl=10.0):
    """Lesson 02: a successor waits for the transaction that holds the fence row's lock.

    A (7) opens its fenced write of INV-1 at t=2 and stops ``hold`` s inside
    the open transaction. B (8) acquires at A's expiry; its fenced write waits
    on SQLite's write lock (``wait`` events, real ``database is locked``
    answers) until A commits, then raises the fence and reads A's invoice
    before writing. A's NEXT fenced write (INV-2) bounces: the serialization
    point is B's raise, not the wall-clock instant of expiry. Unprotected,
    writers use plain transactions without the fence, so A's INV-2 lands on
    B's run.

    Knobs:
        hold: how long A stops inside its open transaction (s).
        ttl: the lease's length (s).
    """
    hold, ttl = check_number(hold, "hold"), check_number(ttl, "ttl", positive=True)

    def run_a(w):
        lease = yield from w.acquire(ttl)
        yield w.env.timeout(2.0)
        yield from w.write("INV-1", amount(w, 100), lease.generation, fenced=protected, read=True)
        yield w.env.timeout(1.0)
        yield from w.write("INV-2", amount(w, 100), lease.generation, fenced=protected, read=True)
        yield from w.release(lease)

    def run_b(w):
        lease = yield from w.acquire_when_free(ttl)
        yield from w.write("INV-1", amount(w, 200), lease.generation, fenced=protected, read=True)
        w.read(["INV-2"])
        yield w.env.timeout(work(w))
        yield from w.write("INV-2", amount(w, 200), lease.generation, fenced=protected)
        yield from w.release(lease)

    sim.start(sim.worker("A", pauses={"inside-write": hold}), run_a)
    sim.start(sim.worker("B"), run_b)


@scenario
def same_generation_duplicate(sim, *, protected, repeats=2, ttl=10.0):
    """Lesson 02: equal generations pass the fence, so the fence does not stop a repeat.

    A (7) writes INV-1 and releases. B (8) bills order 42: in one fenced
    transaction it creates the next invoice. The acknowledgement is lost, so
    B's job runner repeats the step (``repeats`` attempts in all). Every
    repeat carries generation 8 and passes the fence. Unprotected, each one
    creates another invoice for the same order; protected, the step runs under
    :func:`~labkit.run_once` with the operation key ``bill/order-42``, and the
    repeats return the first invoice.

    Knobs:
        repeats: how many times B's runner sends the step (>= 1).
        ttl: the lease's length (s).
    """
    repeats = check_number(repeats, "repeats", integer=True, low=1, high=20)
    ttl = check_number(ttl, "ttl", positive=True)
    key = "bill/order-42"

    def run_a(w):
        lease = yield from w.acquire(ttl)
        yield w.env.timeout(1.0)
        yield from w.write("INV-1", amount(w, 100), lease.generation)
        yield from w.release(lease)

    def bill(w, generation):
        made = []

        def effect(tx):
            n = tx.execute("SELECT count(*) FROM invoices WHERE job_id = ?", (JOB,))[0][0]
            made.append(f"INV-{n + 1}")
            upsert_invoice(tx.conn, made[-1], 420, generation)
            return made[-1]

        yield from w.wait_for_lock()
        with w.fence().guard(generation) as tx:
            invoice = run_once(tx, key, effect, payload={"order": 42}) if protected else effect(tx)
        w.record("raise", "ok", generation=generation, target=JOB)
        w.record(
            "write", "ok" if made else "duplicate", generation=generation, key=key, target=invoice
        )

    def run_b(w):
        lease = yield from w.acquire_when_free(ttl, poll=1.0)
        yield from w.raise_fence(lease.generation)
        for attempt in range(repeats):
            yield w.env.timeout(work(w))
            yield from bill(w, lease.generation)
            try:
                yield from w.reply("write")
                break
            except NoResponse:
                continue
        yield from w.release(lease)

    sim.start(sim.worker("A"), run_a)
    sim.start(sim.worker("B", lose=["write"] * (repeats - 1), timeout=3.0), run_b, at=0.5)
