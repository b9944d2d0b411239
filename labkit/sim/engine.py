"""The scenario engine: simulated workers on simpy, acting on real SQLite files.

A :class:`Sim` owns a ``simpy.Environment`` (virtual time), a temporary folder of
real SQLite files (:mod:`labkit.sim.files`), one seeded ``random.Random`` and the
history. The lease authority is one :class:`~labkit.LeaseAuthority` reading the
simulation's time. Each :class:`~labkit.sim.worker.Worker` runs a plain generator
function with its OWN connection to the resource database, so the waiting you
see is the waiting SQLite really imposed; its faults (pauses and crashes at
named points, message latency, lost responses, a skewed clock) are planned
when it is made (see :mod:`labkit.sim.worker`).

Writing a scenario (the shape every scenario in :mod:`labkit.scenarios` has)::

    from labkit.errors import check_number
    from labkit.sim import scenario

    @scenario
    def stale_writer(sim, *, protected, pause=30.0, ttl=10.0):
        \"\"\"A pauses after reading; B takes over; A writes on resume.\"\"\"
        pause, ttl = check_number(pause, "pause"), check_number(ttl, "ttl", positive=True)
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
:func:`labkit.check` on the history and writes the verdict
(:func:`~labkit.sim.verdict.describe`). The builder may return a function
``(history, violations, tables) -> str | None`` to word the verdict itself.
Every registered scenario is in :data:`SCENARIOS`.

:func:`play` runs a scenario paced in wall-clock time instead (``factor``
wall seconds per virtual second, on ``simpy.rt.RealtimeEnvironment``) and
calls ``step(sim)`` as it goes: the live replay in :mod:`labkit.views.widgets`
draws from there.
"""

from __future__ import annotations

import functools
import inspect
from random import Random
import shutil
from dataclasses import dataclass
from typing import Any, Callable

import simpy
import simpy.rt

from labkit.db import check_name, execute, quote
from labkit.errors import BadArgument, BadArgumentType
from labkit.sim.history import Event, check
from labkit.lease import LeaseAuthority
from labkit.sim.files import connect_file, new_folder
from labkit.sim.verdict import describe
from labkit.errors import check_number
from labkit.sim.worker import (
    JOB,
    LEASE,
    TICK,
    Crashed,
    LocalClock,
    NoResponse,
    Worker,
    upsert_invoice,
)

__all__ = [
    "Sim",
    "Worker",
    "Result",
    "scenario",
    "check_number",
    "SCENARIOS",
    "SimClock",
    "LocalClock",
    "Crashed",
    "NoResponse",
    "upsert_invoice",
    "describe",
    "JOB",
    "LEASE",
    "TICK",
]

#: every scenario made with :func:`scenario`, by name
SCENARIOS: dict[str, Callable[..., "Result"]] = {}


@dataclass(frozen=True, slots=True)
class Result:
    """What one run of a scenario did.

    Attributes:
        params: every knob it ran with, plus ``protected`` and ``seed``.
        history: the tuple of :class:`~labkit.sim.history.Event` records, in order.
        tables: table name -> list of row dicts, read from the real SQLite files at the end.
        violations: the tuple of :class:`~labkit.sim.history.Violation` that :func:`labkit.check` found.
        verdict: one line a student can read.
    """

    params: dict
    history: tuple
    tables: dict
    violations: tuple
    verdict: str

    def __repr__(self) -> str:
        return (
            f"Result(verdict={self.verdict!r}, violations={len(self.violations)}, "
            f"events={len(self.history)}, params={self.params!r})"
        )

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


def _generations(tables: dict) -> dict:
    """The final state a run is checked against: ``invoice_id -> generation``."""
    return {r["invoice_id"]: r["generation"] for r in tables.get("invoices", [])}


class Sim:
    """One simulation run: virtual time, real SQLite files in a temp folder, a seeded rng, a history.

    Attributes:
        env: the ``simpy.Environment`` (or ``simpy.rt.RealtimeEnvironment`` when ``factor`` is given).
        rng: ``Random(seed)``; the only randomness a scenario may use.
        clock: the authority's :class:`SimClock`.
        authority: the :class:`~labkit.LeaseAuthority` on the ``authority`` database.
        history: the list of :class:`~labkit.sim.history.Event` appended so far.
        tick: virtual seconds between retries of a locked database.
        layout: table name -> database name, for :meth:`tables` (e.g. ``{"invoices": "resource"}``).
        final: ``tables -> final state``, what :meth:`result` checks the history against
            (default ``invoice_id -> generation``; a scenario with other tokens replaces it).

    Example:
        >>> with Sim(seed=0) as sim:
        ...     w = sim.worker("A")
        ...     _ = sim.start(w, lambda w: (yield from w.acquire(10)))
        ...     sim.run()
        ...     [(e.worker, e.action, e.outcome, e.generation) for e in sim.history]
        [('A', 'acquire', 'ok', 1)]
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        factor: float | None = None,
        tick: float = TICK,
        earlier_holders: int = 0,
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise BadArgumentType("seed", f"must be an int, got {type(seed).__name__}")
        self.tick = check_number(tick, "tick", positive=True)
        if factor is None:
            self.env = simpy.Environment()
        else:
            self.env = simpy.rt.RealtimeEnvironment(
                factor=check_number(factor, "factor", positive=True), strict=False
            )
        self.rng = Random(seed)
        self.clock = SimClock(self.env)
        self.history: list[Event] = []
        self.workers: dict[str, Worker] = {}
        self.processes: dict[str, simpy.Process] = {}
        self.layout = {
            "invoices": "resource",
            "job_fence": "resource",
            "idempotency_keys": "resource",
            "leases": "authority",
            "lease_counter": "authority",
        }
        self.final: Callable[[dict], dict] = _generations
        self._dir = new_folder(check_number(earlier_holders, "earlier_holders", integer=True))
        self._admin: dict[str, Any] = {}
        self.authority = LeaseAuthority(self.database("authority"), self.clock)

    # -- databases -------------------------------------------------------------------
    def path(self, name: str) -> str:
        """The file path of database ``name`` inside the sim's temp folder."""
        check_name(name, "name")
        if not name.replace("-", "").replace("_", "").isalnum():
            raise BadArgument("name", f"must be letters, digits, - or _, got {name!r}")
        return str(self._dir / f"{name}.db")

    def connect(self, name: str = "resource"):
        """A new connection to database ``name`` (``busy_timeout_ms=0``: a locked database answers at once)."""
        return connect_file(self.path(name))

    def database(self, name: str = "resource"):
        """The sim's own (admin) connection to database ``name``, created on first use."""
        if name not in self._admin:
            self._admin[name] = self.connect(name)
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

    # -- workers, processes and the history ---------------------------------------------
    def worker(self, name: str, **faults) -> Worker:
        """Create worker ``name`` with its own connections; ``faults`` as for :class:`Worker`."""
        name = check_name(name, "name")
        if name in self.workers:
            raise BadArgument("name", f"worker {name!r} exists already")
        self.workers[name] = Worker(self, name, **faults)
        return self.workers[name]

    def start(
        self, worker: Worker, body: Callable, *args, at: float = 0.0, **kwargs
    ) -> simpy.Process:
        """Run ``body(worker, *args, **kwargs)`` (a generator function) from virtual time ``at``.

        A :class:`Crashed` or ``simpy.Interrupt`` that escapes the body ends that
        worker for good (its open transaction has rolled back) and is recorded.
        """
        at = check_number(at, "at")

        def life():
            if at > self.env.now:
                yield self.env.timeout(at - self.env.now)
            try:
                return (yield from body(worker, *args, **kwargs))
            except (Crashed, simpy.Interrupt) as exc:
                if not isinstance(exc, Crashed):  # a Crashed was recorded where it was raised
                    worker.record("crash", "ok", target=str(getattr(exc, "cause", "")) or None)
                return None

        self.processes[worker.name] = self.env.process(life())
        return self.processes[worker.name]

    def interrupt(self, worker: Worker, at: float, cause: str = "crash") -> None:
        """Crash ``worker`` at virtual time ``at``: a ``simpy.Interrupt`` is thrown into it."""
        at = check_number(at, "at")

        def nemesis():
            yield self.env.timeout(max(0.0, at - self.env.now))
            process = self.processes.get(worker.name)
            if process is not None and process.is_alive:
                process.interrupt(cause)

        self.env.process(nemesis())

    def record(
        self,
        worker: str,
        action: str,
        outcome: str = "ok",
        *,
        generation=None,
        key=None,
        target=None,
        until=None,
    ) -> Event:
        """Append ``Event(now, worker, action, outcome, ...)`` to the history and return it.

        Workers record through :meth:`Worker.record`; a participant that is not a
        worker (an operator, a sweeper's notification, a crowd of contenders) records here.
        """
        event = Event(float(self.env.now), worker, action, outcome, generation, key, target, until)
        self.history.append(event)
        return event

    def run(self, until: float | None = None) -> None:
        """Run until nothing is scheduled (or until virtual time ``until``)."""
        self.env.run(until=until)

    # -- the end ------------------------------------------------------------------------
    def result(self, params: dict, wording: Callable | None = None) -> Result:
        """Read the tables, check the history and return the frozen :class:`Result`."""
        tables = self.tables()
        final = self.final(tables)
        history = tuple(self.history)
        violations = tuple(check(history, final=final))
        verdict = (wording(history, violations, tables) if wording else None) or describe(
            history, violations
        )
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
    knobs = {
        k: p.default for k, p in params.items() if p.kind is p.KEYWORD_ONLY and k != "protected"
    }

    @functools.wraps(builder)
    def run(*, protected: bool = True, seed: int = 0, **given) -> Result:
        return play(run, protected=protected, seed=seed, **given)

    run.knobs = dict(knobs)
    run.build = builder
    run.__signature__ = inspect.Signature(
        [
            inspect.Parameter("protected", inspect.Parameter.KEYWORD_ONLY, default=True),
            inspect.Parameter("seed", inspect.Parameter.KEYWORD_ONLY, default=0),
        ]
        + [
            inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v)
            for k, v in knobs.items()
        ],
        return_annotation=Result,
    )
    SCENARIOS[builder.__name__] = run
    return run


def play(
    f: Callable,
    *,
    protected: bool = True,
    seed: int = 0,
    factor: float | None = None,
    step: Callable[[Sim], None] | None = None,
    every: float = 1.0,
    **given,
) -> Result:
    """Run scenario ``f`` once; optionally paced (``factor`` wall s per virtual s) with ``step(sim)`` callbacks.

    ``step`` is called every ``every`` virtual seconds while the run goes on,
    and once at the end (the live replay redraws from it).
    """
    if not isinstance(protected, bool):
        raise BadArgumentType("protected", f"must be True or False, got {type(protected).__name__}")
    unknown = sorted(set(given) - set(f.knobs))
    if unknown:
        raise BadArgument(
            unknown[0], f"is not a knob of {f.__name__}; its knobs are {sorted(f.knobs)}"
        )
    knobs = {**f.knobs, **given}
    with Sim(seed=seed, factor=factor, earlier_holders=6) as sim:
        wording = f.build(sim, protected=protected, **knobs)
        if step is None:
            sim.run()
        else:
            every = check_number(every, "every", positive=True)
            while any(p.is_alive for p in sim.processes.values()):
                sim.run(until=sim.env.now + every)
                step(sim)
        return sim.result({**knobs, "protected": protected, "seed": seed}, wording)
