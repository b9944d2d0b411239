"""Real worker processes on one SQLite file: the invoice job, for real.

One worker loop, shared by the process tests, :mod:`labkit.processes.live` and
:mod:`labkit.processes.chaos`. Each worker is an OS process (``python -m labkit.processes.workers``)
that repeats::

    acquire -> raise the fence -> read -> work -> (write -> renew) per invoice -> release

The write path is switched at run time through a shared byte:

* protected: ``Fence.guard(generation)``, then (inside that transaction) a
  check that the worker's own lease deadline has not passed, then the effect
  through ``run_once(tx, key)``. A stale writer is refused by the fence; a
  redelivered operation is stopped by its key.
* unprotected: a plain ``BEGIN IMMEDIATE`` upsert. No fence, no key, no
  deadline check: the writer who "followed the lock API" and nothing more.

The effect of one write is an invoice upsert (amount = what the run read plus
this run's charge) and one row in ``invoice_lines`` (the charge itself). So in
a correct run every invoice's amount equals the sum of its lines.

History. Every attempt and answer becomes a :class:`labkit.sim.history.Event`. A
committed write is recorded in the ``history`` table *inside its own
transaction*, so the record exists exactly when the write committed (a SIGKILL
can lose neither one without the other). Everything else is appended to a
JSON-lines journal per process, one ``os.write`` per line on an ``O_APPEND``
descriptor, so a killed process leaves whole lines. Times are seconds of the
shared monotonic clock since the team's start; a worker reads them inside its
transactions, so their order is the order in which SQLite committed.

The board is a small shared-memory file: byte 0 says protected (1) or not,
byte 1+i is worker i's phase. ``IN_TX`` is set only inside the guarded block
(after ``BEGIN IMMEDIATE`` took the lock) and cleared before ``COMMIT``, so a
stopped worker whose phase is ``IN_TX`` certainly holds the write lock.

Real time is used here on purpose (``RealClock``, ``time.sleep``, one seeded
``random.Random`` per process). The parent side (start, freeze, thaw, kill,
restart, read the history) is :class:`labkit.processes.team.Team`.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from random import Random

from labkit.clock import RealClock
from labkit.db import connect, execute, transaction
from labkit.errors import Busy, LeaseLost, StaleGeneration
from labkit.fence import Fence
from labkit.sim.history import Event
from labkit.idempotency import run_once
from labkit.lease import LeaseAuthority
from labkit.mechanisms.timing import backoff

__all__ = [
    "JOB",
    "IDLE",
    "LEASED",
    "WORKING",
    "IN_TX",
    "WorkerSpec",
    "Worker",
    "Board",
    "Journal",
    "backoff",
    "prepare",
    "read_journals",
    "die_with_parent",
    "main",
]

JOB = "invoice-run"
IDLE, LEASED, WORKING, IN_TX = 0, 1, 2, 3

EXTRA_SCHEMA = """
CREATE TABLE IF NOT EXISTS history (
    run TEXT NOT NULL, time REAL NOT NULL, worker TEXT NOT NULL, action TEXT NOT NULL,
    outcome TEXT NOT NULL, generation INTEGER, key TEXT, target TEXT, until REAL);
CREATE TABLE IF NOT EXISTS invoice_lines (
    key TEXT NOT NULL, invoice_id TEXT NOT NULL, amount INTEGER NOT NULL, generation INTEGER NOT NULL)
"""


def prepare(path: str) -> None:
    """Create labkit's schema, the ``history`` and ``invoice_lines`` tables and the job's fence row."""
    db = connect(path, busy_timeout_ms=5000)
    try:
        with transaction(db):
            for statement in filter(str.strip, EXTRA_SCHEMA.split(";")):
                execute(db, statement)
        Fence(db, JOB)
    finally:
        db.conn.close()


class Board:
    """Shared bytes in a small file, mapped by every process: the mode and each worker's phase.

    Byte 0 is 1 while the protected write path is on; byte ``1 + slot`` is that
    worker's phase (``IDLE``, ``LEASED``, ``WORKING`` or ``IN_TX``).
    """

    def __init__(self, path: str, slots: int | None = None, protected: bool = True) -> None:
        if slots is not None:
            Path(path).write_bytes(bytes([int(protected)]) + bytes(slots))
        self._file = open(path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), 0)

    @property
    def protected(self) -> bool:
        """True while workers take the protected write path."""
        return bool(self._map[0])

    @protected.setter
    def protected(self, value: bool) -> None:
        self._map[0] = int(bool(value))

    def phase(self, slot: int) -> int:
        """Return worker ``slot``'s phase."""
        return self._map[1 + slot]

    def set_phase(self, slot: int, phase: int) -> None:
        """Set worker ``slot``'s phase."""
        self._map[1 + slot] = phase


class Journal:
    """An append-only JSON-lines file of :class:`Event` records, safe under SIGKILL."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, event: Event) -> None:
        """Write ``event`` as one line with a single ``os.write``."""
        os.write(self._fd, (json.dumps(asdict(event)) + "\n").encode())

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)


def _event(record: dict) -> Event:
    if isinstance(record.get("generation"), list):
        record["generation"] = tuple(record["generation"])
    return Event(**record)


def read_journals(folder: str) -> list[Event]:
    """Return every complete line of every ``*.jsonl`` journal in ``folder`` as events."""
    events = []
    for file in sorted(Path(folder).glob("*.jsonl")):
        for line in file.read_bytes().split(b"\n")[:-1]:
            events.append(_event(json.loads(line)))
    return events


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What one worker process needs to know (passed to it as JSON).

    Attributes:
        path: the SQLite file. run_dir: the team's folder (board, journals).
        run: the team's run id (history rows carry it). slot: index on the board.
        name: the worker's name in the history. incarnation: 1, 2, ... after restarts; the lease
            owner is ``name.incarnation``, so a restarted process never passes for its predecessor.
        seed: seeds this process's ``random.Random``. t0: the team's start on the monotonic clock.
        ttl: lease length in seconds. work, hold, rest: (min, max) seconds of work after
            the read, of holding the write lock inside each write, and of rest between runs.
        invoices: invoices per run. redeliver: probability that a write is sent again.
        busy_timeout_ms: the connection's busy timeout. seconds: stop after t0 + seconds (None: never).
        parent: the parent's pid (the worker dies with it).
    """

    path: str
    run_dir: str
    run: str
    slot: int
    name: str
    incarnation: int
    seed: int
    t0: float
    ttl: float = 1.0
    work: tuple = (0.1, 0.3)
    hold: tuple = (0.005, 0.02)
    rest: tuple = (0.0, 0.1)
    invoices: int = 3
    redeliver: float = 0.0
    busy_timeout_ms: int = 200
    seconds: float | None = None
    parent: int = 0

    @property
    def owner(self) -> str:
        """The lease owner: ``name.incarnation``."""
        return f"{self.name}.{self.incarnation}"


class _Stop(Exception):
    """The worker's time is up."""


class _Expired(Exception):
    """Inside the write transaction, the worker found its own lease deadline passed."""


class Worker:
    """One invoice worker, running in its own process (see the module docstring for the loop)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec, self.rng, self.clock = spec, Random(spec.seed), RealClock()
        self.db = connect(spec.path, busy_timeout_ms=spec.busy_timeout_ms)
        self.leases, self.fence = LeaseAuthority(self.db, self.clock), Fence(self.db, JOB)
        self.board = Board(os.path.join(spec.run_dir, "board"))
        self.journal = Journal(
            os.path.join(spec.run_dir, "journal", f"{spec.name}.{spec.incarnation}.jsonl")
        )

    def now(self) -> float:
        """Seconds since the team's start."""
        return self.clock.now() - self.spec.t0

    def note(self, action, outcome, generation=None, key=None, until=None, target=JOB, time_=None):
        """Append one event to this process's journal."""
        self.journal.append(
            Event(
                self.now() if time_ is None else time_,
                self.spec.name,
                action,
                outcome,
                generation,
                key,
                target,
                until,
            )
        )

    def phase(self, phase: int) -> None:
        """Show this worker's phase on the board."""
        self.board.set_phase(self.spec.slot, phase)

    def done(self) -> bool:
        """True once the worker's time (``spec.seconds``) is up."""
        return self.spec.seconds is not None and self.now() >= self.spec.seconds

    def sleep(self, bounds) -> None:
        """Sleep a uniform draw from ``bounds`` (min, max) seconds, from this worker's RNG."""
        time.sleep(self.rng.uniform(*bounds))

    def retry(self, action, call, generation=None, key=None, target=JOB):
        """Run ``call()``; on Busy record it, back off with jitter and try again until time is up."""
        attempt = 0
        while True:
            try:
                return call()
            except Busy:
                attempt += 1
                self.note(action, "busy", generation, key, target=target)
                if self.done():
                    raise _Stop() from None
                time.sleep(backoff(attempt - 1, base=0.01, cap=self.spec.ttl / 2, rng=self.rng))

    def loop(self) -> None:
        """Run rounds until time is up (or forever when ``spec.seconds`` is None)."""
        misses = 0
        try:
            while not self.done():
                self.phase(IDLE)
                lease = self.retry(
                    "acquire", lambda: self.leases.try_acquire(JOB, self.spec.owner, self.spec.ttl)
                )
                if lease is None:
                    misses += 1
                    self.note("acquire", "held")
                    time.sleep(backoff(misses - 1, base=0.02, cap=self.spec.ttl / 2, rng=self.rng))
                    continue
                misses = 0
                self.note(
                    "acquire",
                    "ok",
                    lease.generation,
                    until=lease.expires_at - self.spec.t0,
                    time_=lease.expires_at - lease.ttl - self.spec.t0,
                )
                self.round(lease)
                self.phase(IDLE)
                self.sleep(self.spec.rest)
        except _Stop:
            pass
        self.phase(IDLE)

    def round(self, lease) -> None:
        """One run of the job under ``lease``: raise the fence, read, work, write and renew, release."""
        generation = lease.generation
        self.phase(LEASED)
        if self.board.protected:
            try:
                self.retry("raise", lambda: self._raise(generation), generation)
                self.note("raise", "ok", generation)
            except StaleGeneration:
                self.note("raise", "rejected", generation)
                return
        read = dict(
            execute(self.db, "SELECT invoice_id, amount FROM invoices WHERE job_id = ?", (JOB,))
        )
        for number in range(1, self.spec.invoices + 1):  # the time is taken after the snapshot
            self.note("read", "ok", generation, target=f"INV-{number}")
        self.phase(WORKING)
        self.sleep(self.spec.work)
        for number in range(1, self.spec.invoices + 1):
            invoice, charge = f"INV-{number}", self.rng.randint(1, 99)
            op = (invoice, read.get(invoice, 0) + charge, charge, f"{JOB}/g{generation}/{invoice}")
            outcome = self.write(lease, *op)
            if outcome == "ok" and self.rng.random() < self.spec.redeliver:
                self.write(lease, *op)  # the acknowledgement was "lost": send it again
            if outcome == "rejected":
                return
            try:
                lease = self.retry("renew", lambda: self.leases.renew(lease), generation)
                self.note(
                    "renew",
                    "ok",
                    generation,
                    until=lease.expires_at - self.spec.t0,
                    time_=lease.expires_at - lease.ttl - self.spec.t0,
                )
            except LeaseLost:
                self.note("renew", "lost", generation)
                return
            if self.done():
                break
        before = self.now()
        try:
            self.retry("release", lambda: self.leases.release(lease), generation)
            self.note("release", "ok", generation, time_=before)
        except LeaseLost:
            self.note("release", "lost", generation)

    def _raise(self, generation) -> None:
        with self.fence.guard(generation):
            self.phase(IN_TX)
            self.phase(LEASED)

    def write(self, lease, invoice, amount, charge, key) -> str:
        """Write one invoice on the current path; return ``ok``, ``rejected`` or ``duplicate``."""
        if not self.board.protected:
            self.retry(
                "write",
                lambda: self._plain(lease, invoice, amount, charge, key),
                lease.generation,
                key,
                invoice,
            )
            return "ok"
        ran = []
        try:
            self.retry(
                "write",
                lambda: self._fenced(lease, invoice, amount, charge, key, ran),
                lease.generation,
                key,
                invoice,
            )
        except (StaleGeneration, _Expired):
            self.note("write", "rejected", lease.generation, key, target=invoice)
            return "rejected"
        if not ran:
            self.note("write", "duplicate", lease.generation, key, target=invoice)
            return "duplicate"
        return "ok"

    def _fenced(self, lease, invoice, amount, charge, key, ran) -> None:
        with self.fence.guard(lease.generation) as tx:
            self.phase(IN_TX)
            try:
                self.sleep(self.spec.hold)
                now = self.clock.now()
                if now >= lease.expires_at:
                    raise _Expired()

                def effect(tx):
                    ran.append(True)
                    self._effect(tx.conn, lease.generation, invoice, amount, charge, key, now)
                    return amount

                run_once(tx, key, effect, payload={"invoice": invoice, "amount": amount})
            finally:
                self.phase(LEASED)

    def _plain(self, lease, invoice, amount, charge, key) -> None:
        with transaction(self.db) as conn:
            self.phase(IN_TX)
            try:
                self.sleep(self.spec.hold)
                self._effect(conn, lease.generation, invoice, amount, charge, key, self.clock.now())
            finally:
                self.phase(LEASED)

    def _effect(self, conn, generation, invoice, amount, charge, key, now) -> None:
        execute(
            conn,
            """INSERT INTO invoices(job_id, invoice_id, amount, generation) VALUES (?, ?, ?, ?)
                         ON CONFLICT(job_id, invoice_id) DO UPDATE
                         SET amount = excluded.amount, generation = excluded.generation""",
            (JOB, invoice, amount, generation),
        )
        execute(
            conn,
            "INSERT INTO invoice_lines(key, invoice_id, amount, generation) VALUES (?, ?, ?, ?)",
            (key, invoice, charge, generation),
        )
        execute(
            conn,
            "INSERT INTO history(run, time, worker, action, outcome, generation, key, target) "
            "VALUES (?, ?, ?, 'write', 'ok', ?, ?, ?)",
            (self.spec.run, now - self.spec.t0, self.spec.name, generation, key, invoice),
        )


def die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``).

    If the parent is already gone (it died before the call), exit at once.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    if parent and os.getppid() != parent:
        os._exit(0)


def main(argv: list[str] | None = None) -> None:
    """Entry point of a worker process: ``python -m labkit.processes.workers '<WorkerSpec as JSON>'``."""
    fields = json.loads((sys.argv[1:] if argv is None else argv)[0])
    spec = WorkerSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    die_with_parent(spec.parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    Worker(spec).loop()


if __name__ == "__main__":
    main()
