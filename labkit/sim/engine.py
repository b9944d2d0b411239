"""The scenario engine: simulated workers on simpy (virtual time), acting on real SQLite files.

A scenario has this shape (every scenario in :mod:`labkit.scenarios` has)::

    from labkit.sim import scenario

    @scenario
    def stale_writer(sim, *, protected, pause=30.0, ttl=10.0):
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

    result = stale_writer(protected=False)   # a Result; knobs: {"pause": 30.0, "ttl": 10.0}

:func:`play` runs a scenario, optionally paced in wall-clock time for the live replay."""

import functools
import inspect
import shutil
from dataclasses import dataclass, field
from random import Random
from typing import Any, Callable

import simpy
import simpy.rt

from labkit.db import execute, quote
from labkit.errors import BadArgument, BadArgumentType, LabkitError, check_number
from labkit.lease import LeaseAuthority
from labkit.sim.files import connect_file, new_folder
from labkit.sim.history import TICK, Event, check, describe, warnings
from labkit.sim.worker import Crashed, LocalClock, Worker

__all__ = ["Sim", "Result", "scenario", "play", "SCENARIOS"]

#: every scenario made with :func:`scenario`, by name
SCENARIOS: dict[str, Callable[..., "Result"]] = {}


@dataclass(frozen=True, slots=True)
class Result:
    """What one run of a scenario did: ``params`` (the knobs, ``protected`` and ``seed``),
    ``history`` (a tuple of events), ``tables`` (name -> row dicts, read from the real files
    at the end), ``violations`` (what :func:`labkit.check` found: harm in the data), a one-line
    ``verdict`` and ``warnings`` (timing discipline, :func:`labkit.sim.history.warnings`)."""

    params: dict
    history: tuple = field(repr=False)
    tables: dict = field(repr=False)
    violations: tuple = field(repr=False)
    verdict: str
    warnings: tuple = field(default=(), repr=False)

    @property
    def kinds(self) -> set[str]:
        """The set of violation kinds found (empty for a clean run)."""
        return {v.kind for v in self.violations}


def _generations(tables: dict) -> dict:
    """The final state a run is checked against: ``invoice_id -> generation``."""
    return {r["invoice_id"]: r["generation"] for r in tables.get("invoices", [])}


class _Carried(Exception):
    """A labkit error on its way out of a simpy process. simpy copies a failure as
    ``type(e)(*e.args)`` each time it passes it on, and a LabkitError's ``args`` are its message,
    not its constructor's arguments (``LeaseLost(message)`` is a TypeError); this wrapper's one
    argument is the error itself, so that every copy carries the very error raised."""


def _carrying(generator):
    """Run a process's ``generator``; a labkit error escaping it leaves wrapped in _Carried."""
    try:
        return (yield from generator)
    except LabkitError as error:
        raise _Carried(error) from None


class _Carrier:
    """An environment whose processes pass labkit errors on unchanged (see :class:`_Carried`)."""

    def process(self, generator):
        return super().process(_carrying(generator))


class _Environment(_Carrier, simpy.Environment):
    pass


class _Realtime(_Carrier, simpy.rt.RealtimeEnvironment):
    pass


class Sim:
    """One run: simpy's ``env`` (realtime when ``factor`` is given), real SQLite files in a temp
    folder, ``rng = Random(seed)`` (the only randomness a scenario may use), the lease
    ``authority`` on the virtual ``clock``, the ``history``, and ``layout`` (table -> database).

    >>> with Sim(seed=0) as sim:
    ...     _ = sim.start(sim.worker("A"), lambda w: (yield from w.acquire(10)))
    ...     sim.run()
    ...     [(e.worker, e.action, e.outcome, e.generation) for e in sim.history]
    [('A', 'acquire', 'ok', 1)]
    """

    def __init__(self, *, seed: int = 0, factor: float | None = None, earlier_holders: int = 0):
        self.rng = Random(check_number(seed, "seed", integer=True, signed=True))
        if factor is None:
            self.env = _Environment()
        else:
            factor = check_number(factor, "factor", positive=True)
            self.env = _Realtime(factor=factor, strict=False)
        self.clock = LocalClock(self.env)
        self.tick = TICK
        self.history: list[Event] = []
        self.workers: dict[str, Worker] = {}
        self.processes: dict[str, simpy.Process] = {}
        self.layout = dict.fromkeys(("invoices", "job_fence", "idempotency_keys"), "resource")
        self.layout.update(dict.fromkeys(("leases", "lease_counter"), "authority"))
        self.final: Callable[[dict], dict] = _generations  # tables -> the state result() checks
        self.epochs = False  # do invoices carry an epoch? (see labkit.sim.steps.with_tokens)
        self._dir = new_folder(earlier_holders)
        self._admin: dict[str, Any] = {}
        self.authority = LeaseAuthority(self.database("authority"), self.clock)

    def path(self, name: str) -> str:
        """The file path of database ``name`` inside the sim's temp folder."""
        return str(self._dir / f"{name}.db")

    def connect(self, name: str = "resource"):
        """A new connection to database ``name``; a locked database answers at once (``Busy``)."""
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

    def worker(self, name: str, **faults) -> Worker:
        """Create worker ``name`` with its own connections; ``faults`` as for :class:`Worker`."""
        self.workers[name] = Worker(self, name, **faults)
        return self.workers[name]

    def start(self, worker: Worker, body: Callable, *args, at: float = 0.0, **kwargs):
        """Run ``body(worker, *args, **kwargs)`` (a generator function) from virtual time ``at``;
        a :class:`Crashed` escaping the body ends that worker for good."""

        def life():
            if at > self.env.now:
                yield self.env.timeout(at - self.env.now)
            try:
                return (yield from body(worker, *args, **kwargs))
            except Crashed:
                pass  # recorded where it was raised

        self.processes[worker.name] = self.env.process(life())
        return self.processes[worker.name]

    def record(self, worker: str, action: str, outcome: str = "ok", **fields) -> Event:
        """Append ``Event(now, worker, action, outcome, **fields)`` to the history and return it."""
        self.history.append(Event(float(self.env.now), worker, action, outcome, **fields))
        return self.history[-1]

    def run(self, until: float | None = None) -> None:
        """Run until nothing is scheduled (or until virtual time ``until``); a labkit error a
        process raised leaves as itself, data and all."""
        try:
            self.env.run(until=until)
        except _Carried as carried:
            raise carried.args[0] from None

    def result(self, params: dict, wording: Callable | None = None) -> Result:
        """Read the tables, check the history, word the verdict: the frozen :class:`Result`."""
        tables = self.tables()
        history = tuple(self.history)
        violations = tuple(check(history, final=self.final(tables)))
        warned = tuple(warnings(history))
        verdict = wording(history, violations, tables) if wording else None
        verdict = verdict or describe(history, violations, warned)
        return Result(dict(params), history, tables, violations, verdict, warned)

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


def scenario(builder: Callable) -> Callable[..., Result]:
    """Make ``builder(sim, *, protected, **knobs)`` a scenario ``f(*, protected, seed, **knobs)``.

    Its keyword-only parameters are the knobs (``f.knobs``); ``f`` joins :data:`SCENARIOS`. The
    builder may return ``wording(history, violations, tables) -> str | None`` for the verdict."""
    params = inspect.signature(builder).parameters
    knobs = {
        k: p.default for k, p in params.items() if p.kind is p.KEYWORD_ONLY and k != "protected"
    }

    @functools.wraps(builder)
    def run(*, protected: bool = True, seed: int = 0, **given) -> Result:
        return play(run, protected=protected, seed=seed, **given)

    keyword = inspect.Parameter.KEYWORD_ONLY
    defaults = {"protected": True, "seed": 0, **knobs}
    run.knobs, run.build = dict(knobs), builder
    run.__signature__ = inspect.Signature(
        [inspect.Parameter(k, keyword, default=v) for k, v in defaults.items()],
        return_annotation=Result,
    )
    SCENARIOS[builder.__name__] = run
    return run


#: knobs that are lengths of time and mean nothing at zero, in every scenario that has them
POSITIVE_KNOBS = frozenset({"ttl", "duration", "heartbeat", "session", "poll", "base", "cap"})


def _knob(name: str, value, default):
    """A number knob is >= 0 (> 0 in POSITIVE_KNOBS), an int if its default is; no more."""
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        return value
    whole = isinstance(default, int)
    return check_number(value, name, integer=whole, positive=name in POSITIVE_KNOBS)


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
    """Run scenario ``f`` once and return its :class:`Result`; unknown knobs are a ``BadArgument``.

    ``factor``: wall seconds per virtual second; ``step(sim)`` is called every ``every`` virtual
    seconds and at the end (the live replay draws from it)."""
    if not isinstance(protected, bool):
        raise BadArgumentType("protected", f"must be True or False, got {type(protected).__name__}")
    unknown = sorted(set(given) - set(f.knobs))
    if unknown:
        raise BadArgument(
            unknown[0], f"is not a knob of {f.__name__}; its knobs are {sorted(f.knobs)}"
        )
    knobs = {k: _knob(k, v, f.knobs[k]) for k, v in {**f.knobs, **given}.items()}
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
