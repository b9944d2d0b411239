"""Real worker processes on one SQLite file: the invoice job, for real.

Each worker (``python -m labkit.processes.workers SPEC``) repeats: acquire, raise the fence,
read, work, then per invoice write and renew, release. Protected, a write is ``Fence.guard``, a
check of its own deadline and ``run_once``; unprotected, a plain upsert. Committed writes go to
``invoice_lines``, other events to a JSON-lines journal per process. Real time on purpose."""

import contextlib
import functools
import itertools
import json
import mmap
import os
import signal
import struct
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from random import Random

from labkit.clock import RealClock
from labkit.db import connect, execute, transaction
from labkit.engines.etcd_leases import authority
from labkit.errors import Busy, LeaseLost, StaleGeneration
from labkit.fence import Fence
from labkit.idempotency import run_once
from labkit.mechanisms.timing import backoff
from labkit.sim import JOB, Event, upsert_invoice

__all__ = ["IDLE", "IN_TX", "LEASED", "WORKING", "Worker", "WorkerSpec", "append", "board"]
__all__ += ["LINES", "journal", "main"]

IDLE, LEASED, WORKING, IN_TX = 0, 1, 2, 3
INVOICES = ("INV-1", "INV-2", "INV-3")  # each run writes these

LINES = """CREATE TABLE IF NOT EXISTS invoice_lines (run TEXT NOT NULL, time REAL NOT NULL,
    worker TEXT NOT NULL, key TEXT NOT NULL, invoice_id TEXT NOT NULL, amount INTEGER NOT NULL,
    generation INTEGER NOT NULL)"""


def board(path: str, slots: int | None = None) -> mmap.mmap:
    """Map the board (made with ``slots`` zero bytes): ``board[slot]`` is that worker's phase.
    ``IN_TX`` is set after ``BEGIN IMMEDIATE`` and cleared before ``COMMIT``: a stopped worker
    whose phase is ``IN_TX`` holds the lock."""
    if slots is not None:
        Path(path).write_bytes(bytes(slots))
    with open(path, "r+b") as f:
        return mmap.mmap(f.fileno(), 0)  # the map keeps a file descriptor of its own


#: the run's end (seconds since the team's start): the team writes it, and may move it later
END = struct.Struct("d")


def deadline(path: str, seconds: float | None = None) -> mmap.mmap:
    """Map the run's end (written first as ``seconds``): the workers stop once it has passed."""
    if seconds is not None:
        Path(path).write_bytes(END.pack(seconds))
    return board(path)


def journal(path: str) -> int:
    """Open an append-only JSON-lines journal of events (see :func:`append`); return its fd."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def append(journal: int, event: Event) -> None:
    """Write ``event`` as one line with a single ``os.write``, so a SIGKILL leaves whole lines."""
    os.write(journal, (json.dumps(asdict(event)) + "\n").encode())


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What one worker process needs (as JSON): the team's ``run_dir`` (``lab.db``, board,
    journals), ``run`` id and monotonic start ``t0``; its board ``slot``, ``name``, ``incarnation``
    (owner ``name.incarnation``) and ``seed``; (min, max) seconds to ``work``, ``hold`` the lock,
    ``rest``; the chance to ``redeliver``; ``seconds`` (None: forever); ``etcd``'s endpoints."""

    run_dir: str
    run: str
    t0: float
    slot: int = 0
    name: str = "A"
    incarnation: int = 1
    seed: int = 0
    protected: bool = True
    ttl: float = 1.0
    work: tuple = (0.1, 0.3)
    hold: tuple = (0.005, 0.02)
    rest: tuple = (0.0, 0.1)
    redeliver: float = 0.0
    busy_timeout_ms: int = 200
    seconds: float | None = None
    etcd: tuple = ()


class Worker:
    """One invoice worker, running in its own process (see the module docstring for the loop)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec, self.rng, self.clock = spec, Random(spec.seed), RealClock()
        self.owner = f"{spec.name}.{spec.incarnation}"
        folder = spec.run_dir
        self.db = connect(os.path.join(folder, "lab.db"), busy_timeout_ms=spec.busy_timeout_ms)
        self.leases, self.fence = authority(self.db, self.clock, spec.etcd), Fence(self.db, JOB)
        self.acquire = functools.partial(self.leases.try_acquire, JOB, self.owner, spec.ttl)
        self.board, self.end = board(os.path.join(folder, "board")), None
        if spec.seconds is not None:  # the team's end, which it may move later
            self.end = deadline(os.path.join(folder, "end"))
        self.journal = journal(os.path.join(folder, "journal", f"{self.owner}.jsonl"))

    def now(self) -> float:
        """Seconds since the team's start."""
        return self.clock.now() - self.spec.t0

    def note(self, action, outcome, generation=None, key=None, target=JOB, until=None, at=None):
        """Append one event to this process's journal (at ``at``, default now)."""
        at = self.now() if at is None else at
        event = Event(at, self.spec.name, action, outcome, generation, key, target, until)
        append(self.journal, event)

    def granted(self, action: str, lease) -> None:
        """Note an ``ok`` acquire or renew when it was won (an etcd lease says), with its expiry."""
        at = getattr(lease, "since", lease.expires_at - lease.ttl) - self.spec.t0
        self.note(action, "ok", lease.generation, until=lease.expires_at - self.spec.t0, at=at)

    def phase(self, phase: int) -> None:
        self.board[self.spec.slot] = phase

    def done(self) -> bool:
        return self.end is not None and self.now() >= END.unpack_from(self.end)[0]

    def back_off(self, attempt: int, base: float) -> None:
        time.sleep(backoff(attempt, base=base, cap=self.spec.ttl / 2, rng=self.rng))

    def retry(self, action, call, generation=None, key=None, target=JOB):
        """Run ``call()``; on Busy note it and back off, until time is up (then TimeoutError)."""
        for attempt in itertools.count():
            try:
                return call()
            except Busy:
                self.note(action, "busy", generation, key, target)
                if self.done():
                    raise TimeoutError("still busy when the worker's time was up") from None
                self.back_off(attempt, 0.01)

    def loop(self) -> None:
        """Run rounds until time is up (or forever when ``spec.seconds`` is None)."""
        misses = 0
        with contextlib.suppress(TimeoutError):  # from retry, once time is up
            while not self.done():
                self.phase(IDLE)
                lease = self.retry("acquire", self.acquire)
                if lease is None:
                    self.note("acquire", "held")
                    self.back_off(misses, 0.02)
                    misses += 1
                    continue
                misses = 0
                self.granted("acquire", lease)
                self.round(lease)
                self.phase(IDLE)
                time.sleep(self.rng.uniform(*self.spec.rest))
        self.phase(IDLE)

    def round(self, lease) -> None:
        """One run under ``lease``: raise the fence, read, work, write and renew, release."""
        generation = lease.generation
        self.phase(LEASED)
        if self.spec.protected:
            try:
                self.retry("raise", lambda: self.raise_fence(generation), generation)
                self.note("raise", "ok", generation)
            except StaleGeneration:
                self.note("raise", "rejected", generation)
                return
        sql = "SELECT invoice_id, amount FROM invoices WHERE job_id = $1"
        read = dict(execute(self.db, sql, (JOB,)))
        for invoice in INVOICES:  # the time is taken after the snapshot
            self.note("read", "ok", generation, target=invoice)
        self.phase(WORKING)
        time.sleep(self.rng.uniform(*self.spec.work))
        for invoice in INVOICES:
            charge = self.rng.randint(1, 99)
            op = (invoice, read.get(invoice, 0) + charge, charge, f"{JOB}/g{generation}/{invoice}")
            outcome = self.write(lease, *op)
            if outcome == "ok" and self.rng.random() < self.spec.redeliver:
                self.write(lease, *op)  # the acknowledgement was "lost": send it again
            if outcome == "rejected":
                return
            try:
                lease = self.retry("renew", functools.partial(self.leases.renew, lease), generation)
                self.granted("renew", lease)
            except LeaseLost:
                self.note("renew", "lost", generation)
                return
            if self.done():
                break
        before = self.now()
        try:
            self.retry("release", lambda: self.leases.release(lease), generation)
            self.note("release", "ok", generation, at=before)
        except LeaseLost:
            self.note("release", "lost", generation)

    def raise_fence(self, generation) -> None:
        with self.transaction(generation):
            pass

    @contextlib.contextmanager
    def transaction(self, generation):
        """``Fence.guard`` (protected) or a plain ``BEGIN IMMEDIATE``, with the phase ``IN_TX``."""
        with self.fence.guard(generation) if self.spec.protected else transaction(self.db) as tx:
            self.phase(IN_TX)
            try:
                yield tx
            finally:
                self.phase(LEASED)

    def write(self, lease, invoice, amount, charge, key) -> str:
        """Write one invoice on the spec's path; return ``ok``, ``rejected`` or ``duplicate``."""
        generation, ran = lease.generation, []

        def effect(conn, now):
            ran.append(True)
            upsert_invoice(conn, invoice, amount, generation)
            spec, columns = self.spec, "run, time, worker, key, invoice_id, amount, generation"
            row = (spec.run, now - spec.t0, spec.name, key, invoice, charge, generation)
            execute(
                conn,
                f"INSERT INTO invoice_lines({columns}) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                row,
            )
            return amount

        def attempt():
            with self.transaction(generation) as tx:
                time.sleep(self.rng.uniform(*self.spec.hold))
                now = self.clock.now()
                if not self.spec.protected:
                    return effect(tx, now)
                if now >= lease.expires_at:  # its own deadline passed: refuse its own write
                    raise LeaseLost(JOB, self.owner, generation)
                payload = {"invoice": invoice, "amount": amount}
                run_once(tx, key, lambda tx: effect(tx.conn, now), payload=payload)

        try:
            self.retry("write", attempt, generation, key, invoice)
        except (StaleGeneration, LeaseLost):
            self.note("write", "rejected", generation, key, invoice)
            return "rejected"
        if not ran:
            self.note("write", "duplicate", generation, key, invoice)
            return "duplicate"
        return "ok"


def main() -> None:
    """A worker process: ``python -m labkit.processes.workers '<WorkerSpec as JSON>'``."""
    fields = json.loads(sys.argv[1])
    spec = WorkerSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    Worker(spec).loop()


if __name__ == "__main__":
    main()
