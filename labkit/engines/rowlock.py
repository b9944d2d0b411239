"""Lesson 02 on a real row lock, on a throwaway PostgreSQL: what SQLite's file lock cannot show.

A holds its fenced transaction on job X open; B's guard on X, in a thread, waits on A's fence
row, as a watching connection sees in ``pg_blocking_pids`` and ``pg_locks``; C writes job Y
meanwhile. A commits, then B, and A's stale write is refused. Real time is read on purpose.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

from labkit.clock import RealClock
from labkit.db import execute
from labkit.engines import postgres
from labkit.engines.postgres_db import connect, driver
from labkit.engines.servers import MissingBinary, Step
from labkit.fence import Fence
from labkit.errors import Busy, LabkitError, StaleGeneration

__all__ = ["RowLock", "demo", "run"]

X, Y = "invoice-run", "refund-run"
UPSERT = """INSERT INTO invoices VALUES ($1, $2, $3, $4) ON CONFLICT (job_id, invoice_id)
    DO UPDATE SET amount = excluded.amount, generation = excluded.generation"""
# a backend's tuple locks and the locks it waits for, with the pid holding that (0: none)
LOCKS = """SELECT l.locktype, coalesce(l.relation::regclass::text, '-'), l.mode, l.granted,
    coalesce(l.transactionid::text, ''), coalesce(h.pid, 0) FROM pg_locks l LEFT JOIN pg_locks h
    ON h.transactionid = l.transactionid AND h.granted AND NOT l.granted AND h.pid <> l.pid
    WHERE l.pid = $1 AND (l.locktype = 'tuple' OR NOT l.granted) ORDER BY NOT l.granted"""
WAITING = """SELECT coalesce(wait_event_type || '/' || wait_event, 'not waiting')
    FROM pg_stat_activity WHERE pid = $1"""
_CLOCK = RealClock()  # a real-engine run: real time, read through the one clock protocol


@dataclass(frozen=True, slots=True)
class RowLock:
    """What :func:`run` saw: A's and B's backend pids ``a`` and ``b``; while A was open,
    ``blocking`` (``pg_blocking_pids(b)``), B's ``wait_event`` and ``locks`` (rows of
    ``pg_locks``: locktype, relation, mode, granted, transaction id, holder's pid), and whether
    C's write on Y ``committed_beside`` it; how long B ``waited`` (seconds); ``refusal``, A's
    later stale write's StaleGeneration (None if it landed); the stopped ``server_pid``; the
    ``steps`` of job X (B's wait, the raises of its fence, the writes), for the timeline; the
    ``version`` the server reported (``SHOW server_version``)."""

    a: int
    b: int
    blocking: frozenset[int]
    wait_event: str
    locks: tuple[tuple, ...]
    committed_beside: bool
    waited: float
    refusal: StaleGeneration | None
    server_pid: int
    steps: tuple[Step, ...] = ()  # for the timeline: seconds since A's guard opened
    version: str = ""

    @property
    def text(self) -> str:
        """The story in a few lines, each observation marked ✓ (as expected) or ✗."""
        ok = lambda seen: "✓" if seen else "✗"
        rows = [
            f"    {t:<14} {r:<10} {m:<14} {'held' if g else 'waiting'}"
            + (f" for transaction {x}, A's" if h == self.a else "")
            for t, r, m, g, x, h in self.locks
        ]
        lines = [
            f"A, backend {self.a}: Fence({X!r}).guard(7) is open, INV-1 written, not committed",
            f"B, backend {self.b}: Fence({X!r}).guard(8) waits (wait event {self.wait_event})",
            f"{ok(self.blocking == {self.a})} pg_blocking_pids({self.b}) lists "
            + f"{', '.join(map(str, sorted(self.blocking))) or 'nobody'}: B is blocked by A",
            f"{ok(any(row[:2] == ('tuple', 'job_fence') for row in self.locks))} B in pg_locks:",
            *rows,
            f"{ok(self.committed_beside)} C wrote job {Y!r} and committed while A was open",
            f"A commits; B's guard, after waiting {self.waited:.1f} s, goes on and commits 8",
            f"A again with generation 7: {self.refusal or 'its write LANDED'}",
            f"{ok(self.refusal)} stale write {'refused' if self.refusal else 'not refused'}",
        ]
        return "\n".join(lines)


def run(*, hold: float = 1.0, timeout: float = 10.0) -> RowLock:
    """Start a throwaway PostgreSQL, play the story (A holds ``hold`` s once B waits), stop the
    server on every path. ``timeout`` bounds each wait; raises MissingBinary without PostgreSQL."""
    postgres.require()
    with postgres.PostgresServer(settings={"fsync": "off"}) as server, contextlib.ExitStack() as s:
        dbs = [connect(server.url, busy_timeout_ms=int(timeout * 1000)) for _ in "wabc"]
        for db in dbs:
            s.callback(db.close)
        return _play(*dbs, hold=hold, timeout=timeout, server_pid=server.process.pid)


def _play(watch, a, b, c, *, hold, timeout, server_pid) -> RowLock:
    pa, pb = (execute(db, "SELECT pg_backend_pid()")[0][0] for db in (a, b))
    version = execute(watch, "SHOW server_version")[0][0]
    fence_a, fence_b, fence_c = Fence(a, X), Fence(b, X), Fence(c, Y)
    seen: dict = {}
    steps, t0 = [], _CLOCK.now()

    def log(worker, action, outcome, generation, target, at=None) -> None:
        at = _CLOCK.now() if at is None else at
        steps.append(Step(at - t0, worker, action, outcome, generation, None, target))

    def b_writes() -> None:  # B's thread: it blocks on A's fence row
        started = _CLOCK.now()
        try:
            with fence_b.guard(8) as tx:
                seen["waited"] = _CLOCK.now() - started
                tx.execute(UPSERT, (X, "INV-1", 200, 8))
            log("B", "wait", "ok", 8, "fence row", at=started)
            log("B", "raise", "ok", 8, X, at=started + seen["waited"])
            log("B", "write", "ok", 8, "INV-1")
        except LabkitError as exc:
            seen["error"] = exc

    thread = threading.Thread(target=b_writes, name="labkit-rowlock-B", daemon=True)
    try:
        with fence_a.guard(7) as tx:
            tx.execute(UPSERT, (X, "INV-1", 100, 7))
            log("A", "raise", "ok", 7, X)
            log("A", "write", "ok", 7, "INV-1")
            thread.start()
            deadline = _CLOCK.now() + timeout
            while not (event := execute(watch, WAITING, (pb,))[0][0]).startswith("Lock/"):
                if _CLOCK.now() > deadline:
                    break
                time.sleep(0.005)
            blocking = frozenset(execute(watch, "SELECT pg_blocking_pids($1)", (pb,))[0][0])
            locks = tuple(map(tuple, execute(watch, LOCKS, (pb,))))
            with contextlib.suppress(Busy), fence_c.guard(1) as other:  # Y's row: no wait
                other.execute(UPSERT, (Y, "REF-1", 30, 1))
            beside = tx.live and execute(watch, "SELECT 1 FROM invoices WHERE job_id = $1", (Y,))
            time.sleep(hold)
    finally:  # A's transaction has ended, committed or rolled back, and B's wait with it
        if thread.ident is not None:
            thread.join(timeout)
    if "error" in seen:
        raise seen["error"]
    refusal = None
    try:
        with fence_a.guard(7) as tx:
            tx.execute(UPSERT, (X, "INV-1", 100, 7))
    except StaleGeneration as exc:
        refusal = exc
    log("A", "write", "rejected" if refusal else "ok", 7, "INV-1")
    waited = seen.get("waited", float("nan"))
    steps.sort(key=lambda step: step.time)
    return RowLock(
        pa,
        pb,
        blocking,
        event,
        locks,
        bool(beside),
        waited,
        refusal,
        server_pid,
        tuple(steps),
        version,
    )


def demo() -> RowLock | None:
    """The lesson's ▶ button: print the story and return the run, or say what to install
    first and return None."""
    try:
        postgres.require()
        driver()
    except MissingBinary as missing:
        return print(f"✗ this demo needs PostgreSQL's programs: {missing}")
    except LabkitError as missing:  # no psycopg
        return print(f"✗ this demo: {missing}")
    print((played := run()).text)
    return played
