"""The laboratory every grading check runs in: scratch SQLite files, a second worker, a dying process.

* :func:`scratch` gives a trial a temporary folder of real SQLite files (connections
  that never wait for the write lock and skip fsync) and cleans it up afterwards.
* :class:`Tracer` and :func:`between_statements` run another worker's action just
  before the answer's n-th SQL statement: real concurrency, at a point the schedule picks.
* :func:`process` lets a worker's process die at a chosen statement.
* :class:`Schedule` is one way the world can go in a trial; :func:`hostile` and
  :func:`schedules` list a task's.
* :func:`call`, :func:`shown`, :func:`busy`, :func:`is_bool` judge one call;
  :func:`lease_event` records a lease in a trial's history; :func:`keys` reads a quiz's answer key.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Callable, Iterable

from labkit.errors import Busy, LabkitError
from labkit.grading import wire
from labkit.sim.files import connect_file, scratch_folder
from labkit.sim.history import Event


class Fresh(Random):
    """``random.Random(seed)`` that reaches a sandboxed answer as a copy, built there from the
    seed, so that its draws are not each a request to the judge. It crosses once and undrawn;
    then its draws are the copy's, and drawing here as well is refused (it would repeat them)."""

    def __init__(self, seed: int) -> None:
        if type(seed) is not int:
            raise TypeError(f"seed: an int, not {type(seed).__name__}")
        super().__init__(seed)
        self._labkit_seed = seed  # None once drawn here; False once handed over

    def _spend(self) -> None:
        if self._labkit_seed is False:
            raise LabkitError("this rng was handed to the answer: its draws are the answer's")
        self._labkit_seed = None

    def random(self) -> float:
        self._spend()
        return super().random()

    def getrandbits(self, k: int) -> int:
        self._spend()
        return super().getrandbits(k)

    def hand_over(self) -> int:
        if self._labkit_seed is None or self._labkit_seed is False:
            raise LabkitError("a Fresh rng crosses once, before any draw of it")
        seed, self._labkit_seed = self._labkit_seed, False
        return seed


wire.COPIED[Fresh] = Fresh.hand_over


@dataclass(frozen=True, slots=True)
class Schedule:
    """One way the world can go during a trial.

    Attributes:
        seed: seeds the trial's ``random.Random`` (:attr:`rng`, fresh on every read).
        knobs: named timings or choices, e.g. ``{"pause": 30, "ttl": 10}``.
        name: a short label for hostile schedules, e.g. ``"A pauses inside the transaction"``.
        run: the grading run's seed, drawn from the operating system (None: the fixed draws
            of a run without one), which every input of the schedule derives from too.
    """

    seed: int
    knobs: dict = field(default_factory=dict, hash=False)
    name: str = "random"
    run: int | None = None

    @property
    def rng(self) -> Random:
        """Seeded with the seed, or with knob ``inputs`` (a boundary of a row keeps its inputs),
        and the run's seed: the same schedule of another run draws other inputs."""
        return derived(self.run, self.knobs.get("inputs", self.seed))


def derived(run: int | None, key: int) -> Random:
    """The RNG of ``key`` in the run seeded ``run``: ``Random(key)`` for a run without a seed,
    else seeded by both (a string seed is hashed with SHA-512: the same in every process)."""
    return Random(key if run is None else f"{run}/{key}")


def hostile(columns: str, *rows: tuple) -> list[dict]:
    """Hostile schedules as a table: each row is a name, then the knobs named in ``columns``.

    A shorter row leaves out the last knobs.
    """
    keys = ["name", *columns.split()]
    return [dict(zip(keys, row)) for row in rows]


def schedules(
    hostile: Iterable[dict],
    *,
    count: int,
    make: Callable[[Random], dict],
    base: int = 1000,
    run: int | None = None,
    vary: Callable[[dict, Random], dict] | None = None,
) -> list[Schedule]:
    """The hostile schedules (dicts of a ``name`` and knobs), then ``count`` random ones.

    The random ones have seeds ``base``, ``base + 1``, ... and knobs ``make(derived(run, seed))``:
    each grading run (``run``, its seed) draws its own. A run with a seed passes each hostile
    row's knobs through ``vary(knobs, rng)``: the same story told with numbers of its own.
    """
    out = []
    for i, h in enumerate(hostile):
        knobs = {k: v for k, v in h.items() if k != "name"}
        knobs = vary(knobs, derived(run, -1 - i)) if vary and run is not None else knobs
        out.append(Schedule(i, knobs, h.get("name", f"hostile {i}"), run))
    out += [Schedule(s, make(derived(run, s)), run=run) for s in range(base, base + count)]
    return out


#: what a trial's file may grow to, in pages (of 4 KiB: 64 MiB), and the longest string, blob or
#: statement in it (1 MiB): the files are in RAM, and the answer's SQL runs in the judge's process
TRIAL_PAGES, LONGEST = 16384, 1 << 20


class Scratch:
    """A trial's temporary folder of SQLite files; ``opened`` lists the connections :meth:`open` made."""

    def __init__(self, folder: str) -> None:
        self.folder, self.opened = folder, []

    def path(self, name: str = "check.db") -> str:
        return os.path.join(self.folder, name)

    def open(self, name: str = "check.db"):
        """A new connection (busy timeout 0, no fsync, the schema not trusted, the file and its
        values bounded: an answer's SQL may run on it) to file ``name`` in the folder."""
        self.opened.append(connect_file(self.path(name)))
        conn = self.opened[-1].conn
        conn.execute("PRAGMA trusted_schema = OFF")
        conn.execute(f"PRAGMA max_page_count = {TRIAL_PAGES:d}")  # a constant, not a value
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, LONGEST)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, LONGEST)
        return self.opened[-1]


@contextlib.contextmanager
def scratch():
    """Yield a fresh :class:`Scratch`; afterwards close its connections and delete its folder."""
    lab = Scratch(str(scratch_folder("check")))
    try:
        yield lab
    finally:
        for db in lab.opened:
            db.conn.close()
        shutil.rmtree(lab.folder, ignore_errors=True)


#: a statement's literals (strings, numbers) and made-up names (sqlite-utils' savepoints):
#: a boundary is named by what the call does there, the same in every run
LITERALS = re.compile(r"'(?:[^']|'')*'|\b\w*[0-9a-f]{8,}\w*\b|\b\d+(?:\.\d+)?\b")


def boundary(sql: str, seen: dict) -> str:
    """The name of the boundary before ``sql``: its text with literals as ``?``, and how many
    statements of that text the call sent before (``seen`` counts them), e.g. ``"COMMIT#1"``."""
    text = " ".join(LITERALS.sub("?", sql).split())[:200]
    seen[text] = seen.get(text, 0) + 1
    return f"{text}#{seen[text]}"


class Tracer:
    """Records the SQL one connection sends (in ``sql``); runs ``action`` just before its
    ``at``-th statement, or before the statement whose :func:`boundary` is ``at`` (a string).

    Trigger echoes and re-prepares do not count. Until the action runs, each boundary the call
    reaches is reported to the running schedule (:data:`RIVAL`). ``action()``'s result is kept
    in ``result``; SQLite's trace callback swallows exceptions, so actions catch their own.
    """

    def __init__(self, db) -> None:
        self.sql: list[str] = []
        self.at, self.action, self.result, self.seen = 0, None, None, {}
        db.conn.set_trace_callback(self)

    def __call__(self, sql) -> None:
        if not isinstance(sql, str) or sql.startswith("--") or (self.sql and self.sql[-1] == sql):
            return
        self.sql.append(sql)
        if self.action is None:
            return
        name, rival = boundary(sql, self.seen), RIVAL[-1] if RIVAL else {}
        rival.setdefault("keys", []).append(name)
        if len(self.sql) == self.at or name == self.at:
            action, self.action = self.action, None
            rival["came"] = True  # the call reached the rival's boundary
            self.result = action()

    def before(self, n, action) -> None:
        """Run ``action()`` just before the ``n``-th statement from now (1 = the next one), or
        before the boundary named ``n``."""
        self.at = len(self.sql) + n if isinstance(n, int) else n
        self.action, self.result, self.seen = action, None, {}


@contextlib.contextmanager
def between_statements(db, at: int, action):
    """Run ``action()`` just before the ``at``-th statement sent on ``db``.

    Yields a dict whose ``"done"`` says whether ``action()`` ran and returned something
    true: False when it raised (the answer holds the write lock) or never came.
    """
    seen = {"done": False}

    def attempt() -> None:
        try:
            seen["done"] = bool(action())
        except Exception:  # busy: the answer's transaction keeps the world still
            seen["done"] = False

    tracer = Tracer(db)
    if at:
        tracer.before(at, attempt)
    try:
        yield seen
    finally:
        db.conn.set_trace_callback(None)


#: the schedule running now (verdict's): whether its rival came before a statement of the call
RIVAL: list[dict] = []
#: the seed of the answer's own ``random`` in the schedule being run (see verdicts._run)
LUCK: list[int] = []
#: id(connection) -> the tables on which the answer's SQL on that connection may create triggers
#: (a task that asks for them, 03.3: read through the module, as DYING is)
TRIGGERS: dict[int, frozenset] = {}
#: id(connection) -> whether its worker's process is dead (the judge kills a sandboxed worker's
#: process when one of its requests ends so: see labkit.grading.forks)
DYING: dict[int, Callable[[], bool]] = {}


@contextlib.contextmanager
def process(db, dies):
    """Run a worker on ``db`` whose process dies when ``dies(sql)`` first says so.

    From then on every statement on ``db`` is interrupted; closing the connection
    rolls back what was open. An answer judged in the sandbox is killed there for real (its
    process gets SIGKILL, its call raises :class:`~labkit.grading.forks.Killed`). Yields a dict
    whose ``"dead"`` says whether it died.
    """
    seen = {"dead": False}

    def trace(sql: str) -> None:
        if not seen["dead"] and dies(sql):
            seen["dead"] = True

    db.conn.set_trace_callback(trace)
    db.conn.set_progress_handler(lambda: 1 if seen["dead"] else 0, 1)
    DYING[id(db.conn)] = lambda: seen["dead"]
    try:
        yield seen
    finally:
        DYING.pop(id(db.conn), None)
        db.conn.set_trace_callback(None)
        db.conn.set_progress_handler(None, 1)


def lease_event(history: list, when: float, lease, action: str = "acquire", outcome: str = "ok"):
    """Append the event of ``lease`` being acquired or renewed (``until`` only when ``"ok"``)."""
    until = lease.expires_at if outcome == "ok" else None
    history.append(
        Event(when, lease.owner, action, outcome, lease.generation, target=lease.name, until=until)
    )


def call(fn, *args):
    """``("returned", value)`` or ``("raised", exception)``; NotImplementedError passes through."""
    try:
        return "returned", fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # judged by the caller
        return "raised", exc


def busy(out) -> bool:
    """Whether the outcome ``out`` of :func:`call` is SQLite refusing the write lock."""
    exc = out[1]
    return out[0] == "raised" and (
        isinstance(exc, Busy) or "locked" in str(exc) or "busy" in str(exc).lower()
    )


LEFT_OPEN = "the write lock: its transaction left open"


def held_open(who: str, began: float) -> Event:
    """The write lock a call kept by leaving its transaction open, as a timeline draws it: held
    from when the call began to the end of the run, with no release and no expiry."""
    return Event(began, who, "acquire", "ok", target=LEFT_OPEN)


def shown(out) -> str:
    """The outcome ``out`` of :func:`call` in words, e.g. ``"returned True"``."""
    kind, value = out
    return (
        f"returned {value!r}" if kind == "returned" else f"raised {type(value).__name__}: {value}"
    )


def is_bool(out, value: bool) -> bool:
    """Whether the call returned ``value`` (as a bool, or as the int 0 or 1)."""
    got = out[1]
    return (
        out[0] == "returned"
        and isinstance(got, (bool, int))
        and got in (0, 1)
        and bool(got) is value
    )


#: where :func:`keys` reads the answer keys: the course's own solutions/ unless the judge is
#: told otherwise (``--solutions``); the sandbox never sees it
SOLUTIONS = os.environ.get("LABKIT_SOLUTIONS") or str(
    Path(__file__).resolve().parents[2] / "solutions"
)


def keys(task_id: str) -> dict:
    """The answer key of a quiz task, from ``SOLUTIONS/keys.json``."""
    try:
        return json.loads((Path(SOLUTIONS) / "keys.json").read_text())[task_id]
    except (OSError, ValueError, KeyError) as exc:
        why = f"task {task_id}: no answer key in {SOLUTIONS}/keys.json ({exc})"
        raise LabkitError(why) from None
