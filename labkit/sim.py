"""The scenario engine: simulated workers on simpy, acting on real SQLite files.

A :class:`Sim` owns a ``simpy.Environment`` (virtual time), a temporary folder of
real SQLite files, one seeded ``random.Random`` and the history. The lease
authority is one :class:`~labkit.LeaseAuthority` reading the simulation's time.
Each :class:`Worker` is a plain generator function with its OWN connection to
the resource database, opened with ``busy_timeout_ms=0``: ``BEGIN IMMEDIATE``
either takes the write lock at once or raises :class:`~labkit.Busy`, which the
engine records as a ``wait`` event and retries after ``sim.tick`` virtual
seconds. The waiting you see is the waiting SQLite really imposed.

Faults are planned per worker and fire at NAMED POINTS the scenario passes
with ``yield from w.point("after-read")``: a pause (a long timeout, also inside
an open transaction that holds the write lock) or a crash (:class:`Crashed` is
raised there, so an open ``with fence.guard(...)`` rolls back). Messages to the
authority take ``request_latency`` and ``response_latency`` seconds (a number,
or a ``(low, high)`` range drawn from the sim's rng); a lost response makes
the worker wait ``timeout`` seconds and raise :class:`NoResponse`.

Writing a scenario (the shape every scenario in :mod:`labkit.scenarios` has)::

    from labkit.sim import scenario, check_knob

    @scenario
    def stale_writer(sim, *, protected, pause=30.0, ttl=10.0):
        \"\"\"A pauses after reading; B takes over; A writes on resume.\"\"\"
        pause, ttl = check_knob(pause, "pause"), check_knob(ttl, "ttl", positive=True)
        a = sim.worker("A", pauses={"after-read": pause})
        b = sim.worker("B")

        def run_a(w):
            lease = yield from w.acquire(ttl)                 # generation 7
            w.read(["INV-1"])                                 # records a read event
            yield from w.point("after-read")                  # the planned pause
            yield from w.write("INV-1", 100, lease.generation, fenced=protected)

        def run_b(w):
            lease = yield from w.acquire_when_free(ttl)       # polls until A's lease expires
            yield from w.write("INV-1", 120, lease.generation, fenced=protected)

        sim.start(a, run_a)
        sim.start(b, run_b, at=1.0)

    result = stale_writer(protected=False)   # -> Result; stale_writer.knobs == {"pause": 30.0, "ttl": 10.0}

:func:`scenario` turns the builder into ``f(*, protected=True, seed=0, **knobs)
-> Result``: it rejects unknown knobs (``BadArgument``), makes the ``Sim``,
runs it to the end, reads the tables from the real files, runs
:func:`labkit.check` on the history and writes the verdict. The builder may
return a function ``(history, violations, tables) -> str | None`` to word the
verdict itself. Every registered scenario is in :data:`SCENARIOS`.

The files live in ``/dev/shm`` when the machine has it (memory-backed, still
real files with real locks) and start as copies of template files made once
per process, so a whole run takes a few milliseconds. :func:`play` runs a
scenario paced in wall-clock time instead (``factor`` wall seconds per
virtual second, on ``simpy.rt.RealtimeEnvironment``) and calls ``step(sim)``
as it goes: the live replay in :mod:`labkit.widgets` draws from there.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import math
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import simpy
import simpy.rt

from .db import check_name, connect, execute, quote, transaction
from .errors import BadArgument, BadArgumentType, Busy, LabkitError, LeaseLost, StaleGeneration
from .clock import VirtualClock
from .fence import Fence, Tx
from .history import Event, Violation, check
from .idempotency import run_once
from .lease import Lease, LeaseAuthority

__all__ = ["Sim", "Worker", "Result", "scenario", "check_knob", "SCENARIOS", "SimClock",
           "LocalClock", "Crashed", "NoResponse", "upsert_invoice", "describe",
           "JOB", "LEASE", "TICK"]

JOB = "invoice-run"      # the fenced job, and the job_id of every invoice
LEASE = "invoice-run"    # the lease's name at the authority
TICK = 0.5               # virtual seconds between retries of a locked database

#: every scenario made with :func:`scenario`, by name
SCENARIOS: dict[str, Callable[..., "Result"]] = {}


@dataclass(frozen=True, slots=True)
class Result:
    """What one run of a scenario did.

    Attributes:
        params: every knob it ran with, plus ``protected`` and ``seed``.
        history: the tuple of :class:`~labkit.history.Event` records, in order.
        tables: table name -> list of row dicts, read from the real SQLite files at the end.
        violations: the tuple of :class:`~labkit.history.Violation` that :func:`labkit.check` found.
        verdict: one line a student can read.
    """

    params: dict
    history: tuple
    tables: dict
    violations: tuple
    verdict: str

    def __repr__(self) -> str:
        return (f"Result(verdict={self.verdict!r}, violations={len(self.violations)}, "
                f"events={len(self.history)}, params={self.params!r})")

    @property
    def kinds(self) -> set[str]:
        """The set of violation kinds found (empty for a clean run)."""
        return {v.kind for v in self.violations}


class SimClock:
    """The authority's clock: ``now()`` is the simulation's virtual time ``env.now``."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env

    def now(self) -> float:
        """Return ``env.now``."""
        return float(self.env.now)

    def __repr__(self) -> str:
        return f"SimClock(now={self.env.now:g})"


def check_knob(value: Any, name: str, *, positive: bool = False, integer: bool = False,
               low: float | None = None, high: float | None = None) -> Any:
    """Return a validated knob value, or raise naming the knob.

    Args:
        value: what the caller passed.
        name: the knob's name, used in the error.
        positive: require > 0 (else >= 0).
        integer: require an int (bools refused).
        low, high: optional inclusive bounds.

    Raises:
        BadArgumentType: not a number (or not an int when ``integer``).
        BadArgument: NaN, infinite, negative, zero when ``positive``, or out of bounds.
    """
    if isinstance(value, bool) or not isinstance(value, (int,) if integer else (int, float)):
        kind = "an int" if integer else "a number"
        raise BadArgumentType(name, f"must be {kind}, got {type(value).__name__}")
    if not math.isfinite(value):
        raise BadArgument(name, f"must be finite, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise BadArgument(name, f"must be {'> 0' if positive else '>= 0'}, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise BadArgument(name, f"must be in {low} .. {high}, got {value!r}")
    return value if integer else float(value)


def upsert_invoice(db, invoice: str, amount: int, generation: int, *, job: str = JOB) -> None:
    """Write one invoice row by UPSERT: a later write replaces an earlier one, whatever its generation.

    This is the resource with no protection of its own: an older owner really
    can overwrite a newer owner's invoice when nothing stops it.
    """
    execute(db, """
        INSERT INTO invoices(job_id, invoice_id, amount, generation)
        VALUES (:job, :invoice, :amount, :generation)
        ON CONFLICT(job_id, invoice_id) DO UPDATE SET
            amount = excluded.amount, generation = excluded.generation""",
        {"job": job, "invoice": invoice, "amount": amount, "generation": generation})


class Crashed(LabkitError):
    """A worker crashed at a named point; its open transaction rolls back.

    Attributes:
        worker: who crashed. point: where.
    """

    def __init__(self, worker: str, point: str) -> None:
        self.worker, self.point = worker, point
        super().__init__(f"{worker} crashed at {point!r}; its open transaction was rolled back")


class NoResponse(LabkitError):
    """The authority's answer was lost: the worker waited ``timeout`` s and does not know the outcome.

    Attributes:
        worker: who asked. action: what it asked for.
    """

    def __init__(self, worker: str, action: str) -> None:
        self.worker, self.action = worker, action
        super().__init__(f"{worker}'s {action} got no response; the authority may have acted on it")


class LocalClock:
    """A worker's own clock: ``offset + (1 + drift) * env.now``. Only that worker reads it."""

    def __init__(self, env: simpy.Environment, offset: float = 0.0, drift: float = 0.0) -> None:
        self.env, self.offset, self.drift = env, offset, drift

    def now(self) -> float:
        """Return this worker's reading of the time."""
        return self.offset + (1.0 + self.drift) * float(self.env.now)

    def __repr__(self) -> str:
        return f"LocalClock(now={self.now():g}, offset={self.offset:g}, drift={self.drift:g})"


class Worker:
    """A simulated worker: its own SQLite connections, its local clock, its planned faults.

    Every method that can take virtual time is a generator: call it with
    ``yield from``. Every attempt is appended to ``sim.history`` with the answer.

    Args (keyword-only, via :meth:`Sim.worker`):
        pauses: ``{point: seconds}``; each fires once, the first time the worker passes ``point``.
        crash_at: a point name; the worker raises :class:`Crashed` there.
        request_latency, response_latency: seconds per message to/from the authority,
            a number or a ``(low, high)`` range drawn from ``sim.rng``.
        lose: action names (``"acquire"``, ``"renew"``, ``"release"``) whose next response is
            lost, once per listed name; ``loss`` is a probability for every response.
        timeout: how long a worker waits for a lost response before :class:`NoResponse`.
        offset, drift: skew this worker's :attr:`clock` only.

    Attributes:
        name, sim, env, clock, db (own connection to the resource database).
    """

    def __init__(self, sim: "Sim", name: str, *, pauses: dict | None = None, crash_at: str | None = None,
                 request_latency=0.0, response_latency=0.0, lose: Iterable[str] = (), loss: float = 0.0,
                 timeout: float = 5.0, offset: float = 0.0, drift: float = 0.0) -> None:
        self.sim, self.name, self.env = sim, name, sim.env
        self.pauses = {check_name(k, "pauses"): check_knob(v, "pause") for k, v in (pauses or {}).items()}
        self.crash_at = None if crash_at is None else check_name(crash_at, "crash_at")
        self.request_latency = self._latency(request_latency, "request_latency")
        self.response_latency = self._latency(response_latency, "response_latency")
        self.lose = [check_name(a, "lose") for a in lose]
        self.loss = check_knob(loss, "loss", high=1.0)
        self.timeout = check_knob(timeout, "timeout")
        self.clock = LocalClock(sim.env, float(offset), float(drift))
        self._conns: dict[str, Any] = {}
        self._fences: dict[tuple, Fence] = {}
        self.held_until: float | None = None   # the holder's expiry in the last "held" answer
        self.db = self.connection("resource")

    @staticmethod
    def _latency(value, name):
        if isinstance(value, (tuple, list)):
            if len(value) != 2:
                raise BadArgument(name, f"must be seconds or a (low, high) pair, got {value!r}")
            low, high = check_knob(value[0], name), check_knob(value[1], name)
            if low > high:
                raise BadArgument(name, f"low {low} is above high {high}")
            return (low, high)
        return check_knob(value, name)

    # -- bookkeeping ------------------------------------------------------------------
    def record(self, action: str, outcome: str = "ok", *, generation=None, key=None,
               target=None, until=None) -> Event:
        """Append ``Event(now, self.name, action, outcome, ...)`` to the history and return it."""
        event = Event(float(self.env.now), self.name, action, outcome, generation, key, target, until)
        self.sim.history.append(event)
        return event

    def connection(self, name: str = "resource"):
        """This worker's own connection to database ``name`` (``busy_timeout_ms=0``)."""
        if name not in self._conns:
            self._conns[name] = _connect(self.sim.path(name))
        return self._conns[name]

    def fence(self, job: str = JOB, db: str = "resource") -> Fence:
        """The :class:`~labkit.Fence` of ``job`` on this worker's connection to ``db``."""
        if (job, db) not in self._fences:
            self._fences[job, db] = Fence(self.connection(db), job)
        return self._fences[job, db]

    def close(self) -> None:
        """Close this worker's connections (an open transaction rolls back)."""
        for db in self._conns.values():
            db.conn.close()
        self._conns.clear()

    # -- faults and time --------------------------------------------------------------
    def point(self, name: str):
        """Pass the named point: pause there if planned (once), crash there if planned."""
        if self.crash_at == name:
            self.record("crash", "ok", target=name)
            raise Crashed(self.name, name)
        if name in self.pauses:
            yield from self.pause(self.pauses.pop(name), name)

    def pause(self, seconds: float, point: str | None = None):
        """Stop for ``seconds`` of virtual time (a GC pause, a frozen VM); recorded with its end."""
        seconds = check_knob(seconds, "seconds")
        self.record("pause", "ok", target=point, until=float(self.env.now) + seconds)
        yield self.env.timeout(seconds)
        self.record("resume", "ok", target=point)

    def _draw(self, latency) -> float:
        return self.sim.rng.uniform(*latency) if isinstance(latency, tuple) else latency

    def locked(self, fn: Callable, *args, db: str = "resource", target=None):
        """Call ``fn(*args)``; while it raises :class:`~labkit.Busy`, record a wait and retry after a tick."""
        while True:
            try:
                return fn(*args)
            except Busy:
                self.record("wait", "busy", target=target or db)
                yield self.env.timeout(self.sim.tick)

    def wait_for_lock(self, db: str = "resource", target=None):
        """Wait (recording ``wait`` events) until ``BEGIN IMMEDIATE`` on ``db`` would succeed now.

        The simulation runs one worker at a time, so nothing can take the lock
        between this and the transaction the caller opens next (without yielding).
        """
        conn = self.connection(db)

        def probe():
            execute(conn, "BEGIN IMMEDIATE")
            execute(conn, "ROLLBACK")
        yield from self.locked(probe, db=db, target=target)

    # -- messages to the authority -------------------------------------------------------
    def _ask(self, action: str, fn: Callable):
        yield self.env.timeout(self._draw(self.request_latency))
        answer = fn()     # the authority acts now, at its own time
        return answer

    def reply(self, action: str):
        """The answer to ``action`` travels back: ``response_latency``, or lost (see ``lose``/``loss``).

        Raises:
            NoResponse: after waiting ``timeout`` s, when this response is lost.
        """
        lost = action in self.lose or (self.loss > 0 and self.sim.rng.random() < self.loss)
        if action in self.lose:
            self.lose.remove(action)
        if lost:
            yield self.env.timeout(self.timeout)
            self.record("response", "lost", target=action)
            raise NoResponse(self.name, action)
        yield self.env.timeout(self._draw(self.response_latency))

    def acquire(self, ttl: float, name: str = LEASE):
        """Ask the authority for lease ``name``: returns the :class:`~labkit.Lease` or None if held.

        Recorded at the authority's time as ``acquire``/``ok`` (with ``until``) or ``held``.

        Raises:
            NoResponse: the answer was lost (the authority may have granted it).
        """
        authority = self.sim.authority
        lease = yield from self._ask("acquire", lambda: authority.try_acquire(name, self.name, ttl))
        if lease is None:
            held = authority.current(name)
            self.held_until = held and held.expires_at
            self.record("acquire", "held", target=name, generation=held and held.generation,
                        until=self.held_until)
        else:
            self.record("acquire", "ok", generation=lease.generation, target=name, until=lease.expires_at)
        yield from self.reply("acquire")
        return lease

    def acquire_when_free(self, ttl: float, name: str = LEASE, poll: float | None = None):
        """Call :meth:`acquire` until it returns a lease.

        Between attempts it waits ``poll`` seconds, or (``poll=None``) until the
        expiry the authority reported for the current holder.
        """
        poll = None if poll is None else check_knob(poll, "poll", positive=True)
        while True:
            lease = yield from self.acquire(ttl, name)
            if lease is not None:
                return lease
            until = self.held_until
            wait = poll if poll is not None or until is None else until - self.env.now
            yield self.env.timeout(max(wait, self.sim.tick if wait <= 0 else 0.0))

    def renew(self, lease: Lease):
        """Ask the authority to renew ``lease``: the new Lease, or None if it was lost."""
        authority = self.sim.authority

        def ask():
            try:
                return authority.renew(lease)
            except LeaseLost:
                return None
        new = yield from self._ask("renew", ask)
        self.record("renew", "ok" if new else "lost", generation=lease.generation, target=lease.name,
                    until=new and new.expires_at)
        yield from self.reply("renew")
        return new

    def release(self, lease: Lease):
        """Ask the authority to release ``lease``: True if it was ours and is now gone."""
        authority = self.sim.authority

        def ask():
            try:
                authority.release(lease)
                return True
            except LeaseLost:
                return False
        done = yield from self._ask("release", ask)
        self.record("release", "ok" if done else "lost", generation=lease.generation, target=lease.name)
        yield from self.reply("release")
        return done

    # -- the resource ---------------------------------------------------------------------
    def read(self, invoices: Iterable[str], job: str = JOB, db: str = "resource") -> dict[str, dict]:
        """Read these invoices (a read never waits in WAL); record one ``read`` per invoice.

        Returns:
            invoice id -> row dict, for the invoices that exist.
        """
        rows = {r[0]: {"invoice_id": r[0], "amount": r[1], "generation": r[2]} for r in execute(
            self.connection(db), "SELECT invoice_id, amount, generation FROM invoices WHERE job_id = ?",
            (job,))}
        for invoice in invoices:
            self.record("read", "ok", target=invoice, generation=rows.get(invoice, {}).get("generation"))
        return {k: v for k, v in rows.items() if k in set(invoices)}

    def write(self, invoice: str, amount: int, generation: int, *, fenced: bool = True,
              key: str | None = None, job: str = JOB, inside: str = "inside-write", read: bool = False):
        """Upsert one invoice in one transaction, through ``fence.guard(generation)`` when ``fenced``.

        Waits for the write lock first (``wait`` events). Inside the open
        transaction it passes point ``inside`` (a planned pause there holds the
        lock; a planned crash rolls back). With ``key``, the upsert runs under
        :func:`~labkit.run_once`, so a repeat of the same key has no effect. With
        ``read``, it reads ``invoice`` inside the transaction, after the fence is raised.

        Returns:
            The recorded outcome: ``"ok"``, ``"rejected"`` (stale) or ``"duplicate"``.
        """
        yield from self.wait_for_lock(target=invoice)
        repeated = [True]

        def effect(tx):
            repeated[0] = False
            upsert_invoice(tx.conn, invoice, amount, generation, job=job)
            return invoice
        try:
            opened = self.fence(job).guard(generation) if fenced else _plain(self.db, generation)
            with opened as tx:
                if read:
                    self.read([invoice], job)
                if key is None:
                    effect(tx)
                else:
                    run_once(tx, key, effect, payload={"invoice": invoice, "amount": amount})
                yield from self.point(inside)
        except StaleGeneration:
            return self.record("write", "rejected", generation=generation, key=key, target=invoice).outcome
        except Crashed:
            self.record("write", "crashed", generation=generation, key=key, target=invoice)
            raise
        if fenced:
            self.record("raise", "ok", generation=generation, target=job)
        outcome = "duplicate" if repeated[0] else "ok"
        return self.record("write", outcome, generation=generation, key=key, target=invoice).outcome

    def raise_fence(self, generation: int, job: str = JOB, db: str = "resource"):
        """Raise the fence of ``job`` to ``generation`` and commit, writing nothing else.

        Returns:
            True if raised (recorded ``raise``/``ok``), False if stale (``raise``/``rejected``).
        """
        yield from self.wait_for_lock(db, target=job)
        try:
            with self.fence(job, db).guard(generation):
                yield from self.point("inside-raise")
        except StaleGeneration:
            self.record("raise", "rejected", generation=generation, target=job)
            return False
        self.record("raise", "ok", generation=generation, target=job)
        return True


_TEMPLATES: dict[int, Path] = {}


def _template(earlier_holders: int) -> Path:
    """A folder with the starting files, made once per process and copied by every Sim.

    ``authority.db`` has issued ``earlier_holders`` generations of the lease (each
    acquired and released at t=0); ``resource.db`` has the job's fence row at 0.
    Copying two closed files is much cheaper than building them for every run.
    """
    if earlier_holders not in _TEMPLATES:
        folder = Path(tempfile.mkdtemp(prefix="labkit-sim-template-", dir=_scratch()))
        atexit.register(shutil.rmtree, folder, True)
        authority_db, resource_db = _connect(str(folder / "authority.db")), _connect(str(folder / "resource.db"))
        authority = LeaseAuthority(authority_db, VirtualClock())
        for n in range(earlier_holders):
            authority.release(authority.acquire(LEASE, f"earlier-{n + 1}", 1.0))
        Fence(resource_db, JOB)
        authority_db.conn.close()    # the last connection to close checkpoints the WAL away
        resource_db.conn.close()
        _TEMPLATES[earlier_holders] = folder
    return _TEMPLATES[earlier_holders]


def _scratch() -> str | None:
    """Where the sim's files go: ``/dev/shm`` (memory-backed, still real files with real
    locks) when there is one, so a run never waits for a disk; else the system temp dir."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def _connect(path: str):
    """``labkit.connect(path, busy_timeout_ms=0)``, with ``synchronous=OFF``.

    The files live in a throwaway temp folder, so durability across a power cut
    does not matter; locking (what the scenarios show) is unchanged.
    """
    db = connect(path, busy_timeout_ms=0)
    execute(db, "PRAGMA synchronous = OFF")
    return db


@contextlib.contextmanager
def _plain(db, generation):
    """``transaction(db)`` shaped like a guard: an unfenced write transaction."""
    with transaction(db) as conn:
        yield Tx(conn, (0, generation))


class Sim:
    """One simulation run: virtual time, real SQLite files in a temp folder, a seeded rng, a history.

    Attributes:
        env: the ``simpy.Environment`` (or ``simpy.rt.RealtimeEnvironment`` when ``factor`` is given).
        rng: ``random.Random(seed)``; the only randomness a scenario may use.
        clock: the authority's :class:`SimClock`.
        authority: the :class:`~labkit.LeaseAuthority` on the ``authority`` database.
        history: the list of :class:`~labkit.history.Event` appended so far.
        tick: virtual seconds between retries of a locked database.
        layout: table name -> database name, for :meth:`tables` (e.g. ``{"invoices": "resource"}``).

    Example:
        >>> with Sim(seed=0) as sim:
        ...     w = sim.worker("A")
        ...     _ = sim.start(w, lambda w: (yield from w.acquire(10)))
        ...     sim.run()
        ...     [(e.worker, e.action, e.outcome, e.generation) for e in sim.history]
        [('A', 'acquire', 'ok', 1)]
    """

    def __init__(self, *, seed: int = 0, factor: float | None = None, tick: float = TICK,
                 earlier_holders: int = 0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise BadArgumentType("seed", f"must be an int, got {type(seed).__name__}")
        self.tick = check_knob(tick, "tick", positive=True)
        if factor is None:
            self.env = simpy.Environment()
        else:
            self.env = simpy.rt.RealtimeEnvironment(factor=check_knob(factor, "factor", positive=True),
                                                    strict=False)
        self.rng = random.Random(seed)
        self.clock = SimClock(self.env)
        self.history: list[Event] = []
        self.workers: dict[str, Worker] = {}
        self.processes: dict[str, simpy.Process] = {}
        self.layout = {"invoices": "resource", "job_fence": "resource",
                       "idempotency_keys": "resource", "leases": "authority",
                       "lease_counter": "authority"}
        self._dir = Path(tempfile.mkdtemp(prefix="labkit-sim-", dir=_scratch()))
        self._admin: dict[str, Any] = {}
        start = _template(check_knob(earlier_holders, "earlier_holders", integer=True))
        for name in ("authority", "resource"):
            shutil.copyfile(start / f"{name}.db", self.path(name))
        self.authority = LeaseAuthority(self.database("authority"), self.clock)

    # -- databases -------------------------------------------------------------------
    def path(self, name: str) -> str:
        """The file path of database ``name`` inside the sim's temp folder."""
        check_name(name, "name")
        if not name.replace("-", "").replace("_", "").isalnum():
            raise BadArgument("name", f"must be letters, digits, - or _, got {name!r}")
        return str(self._dir / f"{name}.db")

    def database(self, name: str = "resource"):
        """The sim's own (admin) connection to database ``name``, created on first use."""
        if name not in self._admin:
            self._admin[name] = _connect(self.path(name))
        return self._admin[name]

    def tables(self) -> dict[str, list[dict]]:
        """Read every table in :attr:`layout` from its real file: name -> list of row dicts."""
        out = {}
        for table, name in self.layout.items():
            db = self.database(name)
            cols = [r[1] for r in execute(db, f"PRAGMA table_info({quote(table)})")]
            rows = execute(db, f"SELECT * FROM {quote(table)} ORDER BY 1, 2")
            out[table] = [dict(zip(cols, r)) for r in rows]
        return out

    # -- workers and processes ---------------------------------------------------------
    def worker(self, name: str, **faults) -> Worker:
        """Create worker ``name`` with its own connections; ``faults`` as for :class:`Worker`."""
        name = check_name(name, "name")
        if name in self.workers:
            raise BadArgument("name", f"worker {name!r} exists already")
        self.workers[name] = Worker(self, name, **faults)
        return self.workers[name]

    def start(self, worker: Worker, body: Callable, *args, at: float = 0.0, **kwargs) -> simpy.Process:
        """Run ``body(worker, *args, **kwargs)`` (a generator function) from virtual time ``at``.

        A :class:`Crashed` or ``simpy.Interrupt`` that escapes the body ends that
        worker for good (its open transaction has rolled back) and is recorded.
        """
        at = check_knob(at, "at")

        def life():
            if at > self.env.now:
                yield self.env.timeout(at - self.env.now)
            try:
                return (yield from body(worker, *args, **kwargs))
            except (Crashed, simpy.Interrupt) as exc:
                if not isinstance(exc, Crashed):   # a Crashed was recorded where it was raised
                    worker.record("crash", "ok", target=str(getattr(exc, "cause", "")) or None)
                return None

        self.processes[worker.name] = self.env.process(life())
        return self.processes[worker.name]

    def interrupt(self, worker: Worker, at: float, cause: str = "crash") -> None:
        """Crash ``worker`` at virtual time ``at``: a ``simpy.Interrupt`` is thrown into it."""
        at = check_knob(at, "at")

        def nemesis():
            yield self.env.timeout(max(0.0, at - self.env.now))
            process = self.processes.get(worker.name)
            if process is not None and process.is_alive:
                process.interrupt(cause)

        self.env.process(nemesis())

    def run(self, until: float | None = None) -> None:
        """Run until nothing is scheduled (or until virtual time ``until``)."""
        self.env.run(until=until)

    # -- the end ------------------------------------------------------------------------
    def result(self, params: dict, wording: Callable | None = None) -> Result:
        """Read the tables, check the history and return the frozen :class:`Result`."""
        tables = self.tables()
        final = {r["invoice_id"]: r["generation"] for r in tables.get("invoices", [])}
        history = tuple(self.history)
        violations = tuple(check(history, final=final))
        verdict = (wording(history, violations, tables) if wording else None) \
            or describe(history, violations)
        return Result(dict(params), history, tables, violations, verdict)

    def close(self) -> None:
        """Close every connection (rolling back open transactions) and delete the temp folder."""
        for w in self.workers.values():
            w.close()
        for db in self._admin.values():
            db.conn.close()
        self._admin.clear()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "Sim":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Sim(now={self.env.now:g}, workers={list(self.workers)})"


_HEADLINE = ("lost_update", "stale_accepted", "duplicate_effect", "acted_after_expiry", "foreign_release")
_LABEL = {"lost_update": "lost update", "stale_accepted": "stale write accepted",
          "duplicate_effect": "duplicate effect", "acted_after_expiry": "acted after expiry",
          "foreign_release": "foreign release"}


def describe(history: Iterable[Event], violations: Iterable[Violation]) -> str:
    """One line for a student: the worst violation, or what stopped the failure.

    Built only from the history and the checker's violations, e.g.
    ``"A (generation 7) overwrote INV-1 written by B (generation 8), after its
    lease expired: lost update, stale write accepted"``.
    """
    violations = list(violations)
    if violations:
        worst = min(violations, key=lambda v: _HEADLINE.index(v.kind))
        same = sorted({v.kind for v in violations if v.event == worst.event}, key=_HEADLINE.index)
        message = worst.message
        if "acted_after_expiry" in same and worst.kind != "acted_after_expiry":
            message += ", after its lease expired"
        others = len({id(v.event) for v in violations if v.event != worst.event})
        more = f" (and {others} more)" if others else ""
        return f"{message}: {', '.join(_LABEL[k] for k in same)}{more}"
    history = list(history)
    fence = None
    for e in history:
        if e.action == "raise" and e.outcome == "ok":
            fence = e.generation
        elif e.action in ("write", "email", "charge") and e.outcome == "rejected":
            at = f" at {fence}" if fence is not None else ""
            return f"{e.worker}'s stale {e.action} with {e.generation} bounced off the fence{at}: nothing lost"
    dup = next((e for e in history if e.outcome == "duplicate"), None)
    if dup is not None:
        return f"{dup.worker}'s repeat of {dup.key!r} was recognised by its key: it took effect once"
    n = sum(1 for e in history if e.action in ("write", "email", "charge") and e.outcome == "ok")
    waits = [e for e in history if e.action == "wait"]
    if waits:
        who = waits[0].worker
        mine = [e.time for e in waits if e.worker == who]
        return (f"{who} waited {mine[-1] - mine[0] + TICK:g} s for the write lock, then went on: "
                f"no violation, {n} committed writes in generation order")
    return f"no violation: {n} committed writes, in generation order, none lost"


def scenario(builder: Callable) -> Callable[..., Result]:
    """Make ``builder(sim, *, protected, **knobs)`` into ``f(*, protected=True, seed=0, **knobs) -> Result``.

    The knobs and their defaults are read from the builder's keyword-only
    parameters and kept in ``f.knobs``; ``f.build`` is the builder (used by
    the live replay). The function is registered in :data:`SCENARIOS`.

    Raises (from the returned function):
        BadArgument: an unknown knob, or a knob the builder rejects (named).
        BadArgumentType: ``protected`` not a bool, ``seed`` not an int.
    """
    params = inspect.signature(builder).parameters
    knobs = {k: p.default for k, p in params.items()
             if p.kind is p.KEYWORD_ONLY and k != "protected"}

    @functools.wraps(builder)
    def run(*, protected: bool = True, seed: int = 0, **given) -> Result:
        return play(run, protected=protected, seed=seed, **given)

    run.knobs = dict(knobs)
    run.build = builder
    run.__signature__ = inspect.Signature(
        [inspect.Parameter("protected", inspect.Parameter.KEYWORD_ONLY, default=True),
         inspect.Parameter("seed", inspect.Parameter.KEYWORD_ONLY, default=0)]
        + [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v) for k, v in knobs.items()],
        return_annotation=Result)
    SCENARIOS[builder.__name__] = run
    return run


def play(f: Callable, *, protected: bool = True, seed: int = 0, factor: float | None = None,
         step: Callable[[Sim], None] | None = None, every: float = 1.0, **given) -> Result:
    """Run scenario ``f`` once; optionally paced (``factor`` wall s per virtual s) with ``step(sim)`` callbacks.

    ``step`` is called every ``every`` virtual seconds while the run goes on,
    and once at the end (the live replay redraws from it).
    """
    if not isinstance(protected, bool):
        raise BadArgumentType("protected", f"must be True or False, got {type(protected).__name__}")
    unknown = sorted(set(given) - set(f.knobs))
    if unknown:
        raise BadArgument(unknown[0], f"is not a knob of {f.__name__}; its knobs are {sorted(f.knobs)}")
    knobs = {**f.knobs, **given}
    with Sim(seed=seed, factor=factor, earlier_holders=6) as sim:
        wording = f.build(sim, protected=protected, **knobs)
        if step is None:
            sim.run()
        else:
            every = check_knob(every, "every", positive=True)
            while any(p.is_alive for p in sim.processes.values()):
                sim.run(until=sim.env.now + every)
                step(sim)
        return sim.result({**knobs, "protected": protected, "seed": seed}, wording)
