"""Grading checks for the exercises of lessons 01-04 (registered in :mod:`labkit.grading`).

Every trial builds the world from labkit's reference code and real SQLite
files, runs the student's function in it under one schedule, and judges what
the function DID: the rows it left, what it returned, the SQL it sent and in
which order. Concurrency is real: a second worker acts on its own connection
just before the answer's n-th SQL statement (from SQLite's trace callback).
If the answer holds the write lock at that moment, the second worker's
``BEGIN IMMEDIATE`` is refused (busy timeout 0: the wait, made visible) and it
tries again once the answer has finished; if it does not, the second worker
really gets in. Generations, amounts, names and pause points come from the
schedule, so no constant or memorised answer fits them all.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import tempfile

from .db import connect, execute
from .errors import Busy
from .grading import Schedule, expect, schedules, task
from .history import Event

JOB, OTHER = "invoice-run", "payroll-run"
CRASH = "simulated crash: the disk is full"
_SETUP = (
    "CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY, job_id TEXT NOT NULL, "
    "invoice_id TEXT NOT NULL, amount INTEGER NOT NULL, generation INTEGER NOT NULL)",
    "CREATE TABLE crash_plan (invoice_id TEXT PRIMARY KEY)",
    *(f"CREATE TRIGGER crash_{t}_{op} BEFORE {op} ON {t} WHEN NEW.invoice_id IN "
      f"(SELECT invoice_id FROM crash_plan) BEGIN SELECT RAISE(ABORT, '{CRASH}'); END"
      for t in ("invoices", "charges") for op in ("INSERT", "UPDATE")),
)


# ---------------------------------------------------------------- the laboratory

class _Tracer:
    """Records the SQL one connection sends; runs ``action`` just before its ``at``-th statement."""

    def __init__(self, db) -> None:
        self.sql: list[str] = []
        self.at, self.action, self.result = 0, None, None
        db.conn.set_trace_callback(self)

    def __call__(self, sql) -> None:
        if not isinstance(sql, str) or sql.startswith("--") or (self.sql and self.sql[-1] == sql):
            return                      # trigger echoes and re-prepares are not new statements
        self.sql.append(sql)
        if self.action is not None and len(self.sql) == self.at:
            action, self.action = self.action, None
            self.result = action()

    def before(self, n: int, action) -> None:
        """Run ``action()`` just before the ``n``-th statement from now (1 = the next one)."""
        self.at, self.action, self.result = len(self.sql) + n, action, None


def _open(path: str):
    """A connection that never waits for the lock; no fsync (a check's files need no durability)."""
    db = connect(path, busy_timeout_ms=0)
    execute(db, "PRAGMA synchronous = OFF")
    return db


@contextlib.contextmanager
def _lab(*workers: str):
    """A fresh SQLite file with the check's tables; yields (observer, {worker: (db, tracer)})."""
    folder = tempfile.mkdtemp(prefix="labkit-check-")
    opened = []
    try:
        def open_():
            opened.append(_open(os.path.join(folder, "check.db")))
            return opened[-1]
        observer = open_()
        for sql in _SETUP:
            execute(observer, sql)
        conns = {}
        for w in workers:
            db = open_()
            conns[w] = (db, _Tracer(db))
        yield observer, conns
    finally:
        for db in opened:
            db.conn.close()
        shutil.rmtree(folder, ignore_errors=True)


def _call(fn, *args):
    """``("returned", value)`` or ``("raised", exception)``."""
    try:
        return "returned", fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:            # judged by the caller
        return "raised", exc


def _busy(out) -> bool:
    exc = out[1]
    return out[0] == "raised" and (isinstance(exc, Busy) or "locked" in str(exc) or "busy" in str(exc).lower())


def _shown(out) -> str:
    kind, value = out
    return f"returned {value!r}" if kind == "returned" else f"raised {type(value).__name__}: {value}"


def _is(out, value: bool) -> bool:
    got = out[1]
    return out[0] == "returned" and isinstance(got, (bool, int)) and got in (0, 1) and bool(got) is value


_RAISE = re.compile(r"\s*(UPDATE(\s+OR\s+\w+)?|INSERT(\s+OR\s+\w+)?\s+INTO|REPLACE\s+INTO)\s+[\[\"`]?job_fence\b", re.I)
_TOUCH = re.compile(r"\b(invoices|charges)\b", re.I)


def _raised_first(sql: list[str]) -> None:
    """The fence is raised before the statement that first reads or writes the protected table."""
    touch = next((i for i, s in enumerate(sql) if _TOUCH.search(s) and "sqlite_master" not in s
                  and not s.lstrip().upper().startswith("PRAGMA")), None)
    if touch is None:
        return
    raised = next((i for i, s in enumerate(sql) if _RAISE.match(s)), None)
    expect(raised is not None and raised < touch,
           "the fence is raised before the protected state is read or written (the UPDATE of job_fence "
           "comes before the first statement that touches it)",
           "the statements were: " + " | ".join(s.strip().split("\n")[0][:70] for s in sql[:touch + 1]))


def _gen(db, job: str) -> int:
    return execute(db, "SELECT generation FROM job_fence WHERE job_id = ?", (job,))[0][0]


# ---------------------------------------------------------------- 02.1 and 03.1: fenced writers

def _state(db):
    return (tuple(execute(db, "SELECT job_id, epoch, generation FROM job_fence ORDER BY job_id")),
            tuple(execute(db, "SELECT job_id, invoice_id, amount, generation FROM invoices ORDER BY 1, 2")))


def _after(state, job: str, gen: int, invoices: dict):
    """The state after an accepted write of ``invoices`` with ``gen``, or None if the fence refuses it."""
    fences, rows = state
    if gen < _fence(state, job):
        return None
    table = {(j, i): (a, g) for j, i, a, g in rows}
    table.update({(job, i): (a, gen) for i, a in invoices.items()})
    return (tuple((j, e, gen if j == job else g) for j, e, g in fences),
            tuple(sorted((j, i, a, g) for (j, i), (a, g) in table.items())))


def _fence(state, job: str) -> int:
    return dict((j, g) for j, _, g in state[0])[job]


def _diff(before, after) -> str:
    if before == after:
        return "nothing changed"
    old_f, new_f = {j: g for j, _, g in before[0]}, {j: g for j, _, g in after[0]}
    old_i, new_i = {(j, i): (a, g) for j, i, a, g in before[1]}, {(j, i): (a, g) for j, i, a, g in after[1]}
    parts = [f"fence of {j}: {old_f.get(j)} -> {new_f.get(j)}" for j in sorted(new_f) if old_f.get(j) != new_f.get(j)]
    parts += [f"{i} of {j}: {old_i.get((j, i))} -> {new_i.get((j, i))}"
              for j, i in sorted(set(old_i) | set(new_i)) if old_i.get((j, i)) != new_i.get((j, i))]
    return "; ".join(parts) + " ((amount, generation))"


class _Writers:
    """Runs a fenced-writer answer against the model of what an accepted or refused write does."""

    def __init__(self, answer, batch: bool, db, conns, history: list) -> None:
        self.answer, self.batch, self.db, self.conns, self.history = answer, batch, db, conns, history
        self.t = 0.0

    def call(self, who: str, job: str, gen: int, invoices: dict):
        db = self.conns[who][0]
        if self.batch:
            return _call(self.answer, db, job, gen, dict(invoices))
        (invoice, amount), = invoices.items()
        return _call(self.answer, db, job, invoice, amount, gen)

    def log(self, who, action, outcome="ok", gen=None, target=None, until=None, dt=1.0) -> None:
        self.t += dt
        self.history.append(Event(self.t, who, action, outcome, gen, target=target, until=until))

    def wrote(self, who: str, gen: int, invoices: dict, before, after, crashed: bool = False) -> None:
        """Log a write as the rows show it, and the fence of JOB if it moved."""
        self.log(who, "write", "crashed" if crashed else ("ok" if after != before else "rejected"), gen,
                 ",".join(invoices))
        if _fence(after, JOB) != _fence(before, JOB):
            self.log(who, "raise", "ok", _fence(after, JOB), JOB, dt=0.0)

    def write(self, who: str, job: str, gen: int, invoices: dict, crash: str | None = None) -> None:
        """One call on its own; judge its answer and the rows it left."""
        db, tracer = self.conns[who]
        before, start = _state(self.db), len(tracer.sql)
        if crash:
            execute(self.db, "INSERT INTO crash_plan VALUES (?)", (crash,))
        out = self.call(who, job, gen, invoices)
        what = f"{who}'s call with generation {gen}"
        expect(not db.conn.in_transaction, "every call ends its transaction with COMMIT or ROLLBACK, whatever happens",
               f"{what} {_shown(out)} and left its transaction open: it still holds the write lock")
        if crash:
            execute(self.db, "DELETE FROM crash_plan")
        after, want = _state(self.db), _after(before, job, gen, invoices)
        self.wrote(who, gen, invoices, before, after, crashed=bool(crash))
        _raised_first(tracer.sql[start:])
        if crash:
            expect(after == before, "a crash inside the transaction leaves nothing behind: no invoice, and the "
                                    "fence where it was", f"the write of {crash} failed ({CRASH}); {_diff(before, after)}")
            expect(out[0] == "raised" or _is(out, False), "a call that crashed does not report success",
                   f"{what} {_shown(out)}")
        elif want is None:
            expect(_is(out, False) and after == before,
                   f"a write with generation {gen} is refused (returns False) and writes nothing when the fence "
                   f"is at {_fence(before, job)}", f"{what} {_shown(out)}; {_diff(before, after)}")
        else:
            expect(_is(out, True), f"a write with generation {gen} is accepted (returns True) when the fence is "
                                   f"at {_fence(before, job)} (equal generations pass)",
                   f"{what} {_shown(out)}")
            expect(after == want, "an accepted write stores its invoices, raises the fence of its own job to its "
                                  "generation, and changes nothing else", f"{what}: {_diff(before, after)}")

    def race(self, job: str, at: int, a_gen: int, b_gen: int, a_inv: dict, b_inv: dict) -> None:
        """A writes with ``a_gen``; B (``b_gen`` > ``a_gen``) acts just before A's ``at``-th statement."""
        tracer = self.conns["A"][1]
        s0, seen = _state(self.db), {}

        def b_acts():
            seen["mid"] = _state(self.db)
            seen["b"] = self.call("B", job, b_gen, b_inv)
            seen["b_after"] = _state(self.db)
        tracer.before(at, b_acts)
        out_a = self.call("A", job, a_gen, a_inv)
        tracer.action = None
        s_a = _state(self.db)
        a_done = _after(s0, job, a_gen, a_inv)
        if not seen:                     # A finished before its at-th statement: B comes after A
            self.wrote("A", a_gen, a_inv, s0, s_a)
            expect(_is(out_a, True) and s_a == a_done, f"a write with generation {a_gen} at the fence is "
                   "accepted, stores its invoices and raises the fence", f"A {_shown(out_a)}; {_diff(s0, s_a)}")
            return self.write("B", job, b_gen, b_inv)
        mid, out_b, s_b = seen["mid"], seen["b"], seen["b_after"]
        if mid != s0:
            self.wrote("A", a_gen, a_inv, s0, mid)
        self.log("A", "pause", "ok", None, f"before its SQL statement {at}", until=self.t + 3.0)
        if _is(out_b, True):
            self.wrote("B", b_gen, b_inv, mid, s_b)
        else:
            self.log("B", "wait", "busy", b_gen, JOB)
        self.log("A", "resume")
        if mid == s0:
            self.wrote("A", a_gen, a_inv, s_b, s_a)
        expect(mid in (s0, a_done), "a call's writes become visible together, at its COMMIT",
               f"just before A's statement {at}, another connection saw: {_diff(s0, mid)}")
        expect(not self.conns["B"][0].conn.in_transaction and not self.conns["A"][0].conn.in_transaction,
               "every call ends its transaction with COMMIT or ROLLBACK", "a transaction was left open")
        if _is(out_b, True):
            expect(s_b == _after(mid, job, b_gen, b_inv), "an accepted write stores its invoices and raises the fence",
                   f"B (generation {b_gen}): {_diff(mid, s_b)}")
            if mid == s0:
                expect(_is(out_a, False) and s_a == s_b,
                       f"once B has committed generation {b_gen}, A's write with {a_gen} is refused and writes nothing "
                       f"(B came in just before A's SQL statement {at})", f"A {_shown(out_a)}; {_diff(s_b, s_a)}")
            else:
                expect(_is(out_a, True) and s_a == s_b, "a write that committed reports True",
                       f"A {_shown(out_a)}; {_diff(s_b, s_a)}")
            return
        expect(_busy(out_b) or _is(out_b, False), "a writer kept out by the lock waits (SQLite says "
               "'database is locked' at busy timeout 0) or reports False", f"B {_shown(out_b)}")
        expect(s_b == mid, "a writer kept out by the lock writes nothing", f"B: {_diff(mid, s_b)}")
        expect(_is(out_a, True) and s_a == a_done,
               f"while A's transaction holds the lock (B was kept out just before A's statement {at}), A's write "
               f"with generation {a_gen} commits whole", f"A {_shown(out_a)}; {_diff(s0, s_a)}")
        self.write("B", job, b_gen, b_inv)      # B's retry, after A's COMMIT


def _invoices(rng: random.Random, fresh: list, batch: bool, known: list) -> dict:
    count = rng.randint(1, 4) if batch else 1
    out = {}
    while len(out) < count:
        if known and rng.random() < 0.35:
            name = rng.choice(known)
        else:
            fresh[0] += 1
            name = f"INV-{fresh[0]}"
            known.append(name)
        out[name] = rng.randrange(100, 990, 5)
    return out


def _fenced_trial(answer, schedule: Schedule, history: list, batch: bool) -> None:
    rng, story = schedule.rng, schedule.knobs["story"]
    with _lab("A", "B") as (db, conns):
        start = {JOB: 7 if story != "random" else rng.randint(1, 40), OTHER: rng.randint(1, 60)}
        for job, g in start.items():
            execute(db, "INSERT INTO job_fence(job_id, epoch, generation) VALUES (?, 0, ?)", (job, g))
        w, fresh, known = _Writers(answer, batch, db, conns, history), [0], []

        def inv(n=None):
            got = _invoices(rng, fresh, batch, known)
            return got if n is None else dict(list(got.items())[:n])
        g = start[JOB]
        if story == "source":                      # the source's numbers, and both halves of the lesson
            w.write("A", JOB, 7, inv())
            w.write("B", JOB, 8, {"INV-1": 200, **(inv() if batch else {})})
            w.write("B", JOB, 8, inv())
            w.write("A", JOB, 7, inv())
            w.write("A", JOB, 7, {"INV-1": 100})
        elif story == "race":
            w.race(JOB, schedule.knobs["at"], 7, 8, inv(), inv())
            w.write("A", JOB, 7, inv())
        elif story == "crash":
            batch_ = inv()
            w.write("B", JOB, 8, batch_, crash=rng.choice(list(batch_)))
            w.write("B", JOB, 8, batch_)
        elif story == "two jobs":
            w.write("B", OTHER, start[OTHER], inv())
            w.write("A", JOB, 9, inv())
            w.write("B", OTHER, start[OTHER] - 1, inv())
            w.write("A", JOB, 8, inv())
        else:
            for _ in range(rng.randint(5, 9)):
                job = JOB if rng.random() < 0.8 else OTHER
                cur = _gen(db, job)
                roll = rng.random()
                if roll < 0.2 and job == JOB:
                    w.race(job, rng.randint(1, 7), cur, cur + rng.randint(1, 3), inv(), inv())
                else:
                    gen = max(0, cur + rng.choice([-3, -1, -1, 0, 0, 1, 2]))
                    batch_ = inv()
                    w.write(rng.choice("AB"), job, gen, batch_, crash=rng.choice(list(batch_)) if roll > 0.85 else None)
        g = _gen(db, JOB)
        w.write("A", JOB, max(0, g - 1), inv())  # the obsolete predecessor, once more at the end


FENCED_HOSTILE = [
    {"name": "the source's story: A writes with 7, B commits 8 (twice), A's 7 comes back", "story": "source"},
    {"name": "B arrives before A's first statement", "story": "race", "at": 1},
    {"name": "A checks the fence, then stops before its 2nd statement; B commits 8", "story": "race", "at": 2},
    {"name": "A stops inside its transaction (before statement 3); B arrives", "story": "race", "at": 3},
    {"name": "A stops before its 4th statement; B arrives", "story": "race", "at": 4},
    {"name": "A stops before its 5th statement; B arrives", "story": "race", "at": 5},
    {"name": "a crash inside the transaction, then the same write again", "story": "crash"},
    {"name": "two jobs, each with its own fence", "story": "two jobs"},
]


@task("02.1", "the fenced insert", schedules(FENCED_HOSTILE, count=16, make=lambda r: {"story": "random"}))
def fenced_insert_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 02.1: ``answer(conn, job, invoice_id, amount, generation) -> bool``."""
    _fenced_trial(answer, schedule, history, batch=False)


@task("03.1", "the race-free batch writer", schedules(FENCED_HOSTILE, count=16, make=lambda r: {"story": "random"}))
def batch_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 03.1: ``answer(conn, job, generation, invoices) -> bool``, all invoices or none."""
    _fenced_trial(answer, schedule, history, batch=True)


# ---------------------------------------------------------------- 02.2: one charge per operation key

def _charges(db):
    return (tuple(execute(db, "SELECT job_id, generation FROM job_fence ORDER BY job_id")),
            tuple(execute(db, "SELECT id, job_id, invoice_id, amount, generation FROM charges ORDER BY id")))


class _Charger:
    """Runs a charge_once answer; ``done`` maps each committed key to its charge's id."""

    def __init__(self, answer, db, conns, history: list) -> None:
        self.answer, self.db, self.conns, self.history, self.done, self.t = answer, db, conns, history, {}, 0.0

    def call(self, who: str, req: tuple):
        return _call(self.answer, self.conns[who][0], *req)

    def log(self, who, req, outcome, action: str = "charge", until=None) -> None:
        self.t += 1.0
        self.history.append(Event(self.t, who, action, outcome, req and req[4], key=req and req[1],
                                  target=req and req[2], until=until))

    def raised(self, who: str, before, after) -> None:
        """Log the fence of JOB if it moved."""
        old, new = dict(before[0]).get(JOB), dict(after[0]).get(JOB)
        if old != new:
            self.history.append(Event(self.t + 1.0, who, "raise", "ok", new, target=JOB))   # with the charge logged next

    def step(self, who: str, req: tuple, before, out, after, crashed: bool = False):
        """Judge one call that went from ``before`` to ``after``; ``out=None``: not returned yet."""
        job, key, invoice, amount, gen = req
        fence, what = dict(before[0])[job], f"{who}'s charge_once(key={key!r}, generation={gen})"
        got = out and _shown(out)
        new = [r for r in after[1] if r not in before[1]]
        self.raised(who, before, after)
        if crashed or gen < fence:
            self.log(who, req, "crashed" if crashed else ("ok" if new else "rejected"))
            why = "a crash inside the transaction leaves no charge, no key and the fence where it was" if crashed \
                else f"a charge with generation {gen} below the fence ({fence}) is refused: it returns None, " \
                     "charges nothing and records no key (the fence decides first, even for a key already used)"
            expect(after == before, why, f"{what} {got}; charges added {new}, fence {dict(after[0])[job]}")
            expect(crashed and out[0] == "raised" or out == ("returned", None), why, f"{what} {got}")
            return None
        raised = tuple((j, gen if j == job else g) for j, g in before[0])
        expect(after[0] == raised, "an accepted call raises the fence of its job to its generation (and no other)",
               f"{what}: fence {before[0]} -> {after[0]}")
        if key in self.done:
            self.log(who, req, "duplicate" if not new else "ok")
            expect(not new, f"a repeat of key {key!r} charges nothing: only the first call takes effect",
                   f"{what} added {new} after the key's charge {self.done[key]} committed")
            expect(out is None or out == ("returned", self.done[key]),
                   "a repeat returns the id of the key's first charge", f"{what} {got}, the first was {self.done[key]}")
            return self.done[key]
        self.log(who, req, "ok" if new else "rejected")
        expect(len(new) == 1 and new[0][1:] == (job, invoice, amount, gen),
               "the first call with a key charges exactly once, with its job, invoice, amount and generation",
               f"{what} added {new}")
        expect(out is None or out == ("returned", new[0][0]), "charge_once returns the id of the charge it made",
               f"{what} {got}; the new charge has id {new[0][0]}")
        self.done[key] = new[0][0]
        return new[0][0]

    def solo(self, who: str, req: tuple, crash: bool = False) -> None:
        db = self.conns[who][0]
        before = _charges(self.db)
        if crash:
            execute(self.db, "INSERT INTO crash_plan VALUES (?)", (req[2],))
        out = self.call(who, req)
        expect(not db.conn.in_transaction, "every call ends its transaction with COMMIT or ROLLBACK",
               f"{who}'s call {_shown(out)} and left its transaction open")
        if crash:
            execute(self.db, "DELETE FROM crash_plan")
        if out[0] == "raised" and not crash:
            raise out[1]
        self.step(who, req, before, out, _charges(self.db), crashed=crash)

    def race(self, req: tuple, at: int) -> None:
        """A sends ``req``; the runner's repeat (same request, B's connection) comes before A's ``at``-th statement."""
        s0, seen = _charges(self.db), {}

        def b_acts():
            seen["mid"] = _charges(self.db)
            seen["b"] = self.call("B", req)
            seen["after"] = _charges(self.db)
        self.conns["A"][1].before(at, b_acts)
        out_a = self.call("A", req)
        self.conns["A"][1].action = None
        s_a = _charges(self.db)
        if out_a[0] == "raised":
            raise out_a[1]
        if not seen:
            self.step("A", req, s0, out_a, s_a)
            return self.solo("B", req)
        mid, out_b, s_b = seen["mid"], seen["b"], seen["after"]
        if mid != s0:                               # A had committed before the repeat came
            self.step("A", req, s0, None, mid)
        self.log("A", None, "ok", "pause", until=self.t + 3.0)
        if out_b[0] == "returned" and out_b[1] is not None:
            self.step("B", req, mid, out_b, s_b)
            self.log("A", None, "ok", "resume")
            self.step("A", req, s_b, out_a, s_a)
            return
        self.log("B", req, "busy", "wait")
        self.log("A", None, "ok", "resume")
        expect(_busy(out_b) or out_b == ("returned", None), "a repeat kept out by the lock waits "
               "('database is locked' at busy timeout 0)", f"the repeat {_shown(out_b)}")
        expect(s_b == mid, "a repeat kept out by the lock changes nothing", f"charges {mid[1]} -> {s_b[1]}")
        if mid == s0:
            self.step("A", req, s0, out_a, s_a)
        self.solo("B", req)


def _key(rng: random.Random, n: int) -> str:
    return f"bill/INV-{n}/{rng.randrange(16 ** 6):06x}"


ONCE_HOSTILE = [
    {"name": "the runner repeats a charge twice (same key, generation 8)", "story": "repeat"},
    {"name": "a stale charge is refused and leaves its key free for the owner", "story": "stale"},
    {"name": "a crash inside the transaction, then the retry", "story": "crash"},
    *({"name": f"the repeat arrives just before the first attempt's statement {n}", "story": "race", "at": n}
      for n in range(1, 7)),
    {"name": "B (8) takes over and repeats A's finished charge", "story": "successor"},
]


@task("02.2", "the charge that happens once per key", schedules(ONCE_HOSTILE, count=14, make=lambda r: {"story": "random"}))
def charge_once_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 02.2: ``answer(conn, job, key, invoice_id, amount, generation) -> charge id | None``."""
    rng, story = schedule.rng, schedule.knobs["story"]
    with _lab("A", "B") as (db, conns):
        start = {JOB: 7 if story != "random" else rng.randint(1, 40), OTHER: rng.randint(1, 60)}
        for job, g in start.items():
            execute(db, "INSERT INTO job_fence(job_id, epoch, generation) VALUES (?, 0, ?)", (job, g))
        c, n = _Charger(answer, db, conns, history), [0]

        def req(gen, job=JOB):
            n[0] += 1
            return (job, _key(rng, n[0]), f"INV-{n[0]}", rng.randrange(100, 990, 5), gen)
        if story == "repeat":
            first = req(8)
            for _ in range(3):
                c.solo("B", first)
        elif story == "stale":
            c.solo("B", req(8))
            stale = req(7)
            c.solo("A", stale)
            c.solo("B", stale[:4] + (8,))
        elif story == "crash":
            first = req(8)
            c.solo("B", first, crash=True)
            c.solo("B", first)
            c.solo("B", first)
        elif story == "race":
            c.race(req(7), schedule.knobs["at"])
        elif story == "successor":
            first = req(7)
            c.solo("A", first)
            c.solo("B", first[:4] + (8,))
            c.solo("A", req(7))
        else:
            made = []
            for _ in range(rng.randint(6, 10)):
                job = JOB if rng.random() < 0.85 else OTHER
                cur, roll = _gen(db, job), rng.random()
                if made and roll < 0.35:
                    old = rng.choice(made)
                    c.solo(rng.choice("AB"), old[:4] + (max(_gen(db, old[0]) + rng.choice([-1, 0, 0, 1]), 0),))
                elif roll < 0.55:
                    made.append(req(cur, job))
                    c.race(made[-1], rng.randint(1, 7))
                else:
                    made.append(req(max(0, cur + rng.choice([-2, 0, 0, 0, 1])), job))
                    c.solo(rng.choice("AB"), made[-1], crash=roll > 0.9)


# ---------------------------------------------------------------- 03.2: why two databases fail

QUIZ = {"q1": "b", "q2": "b", "q3": "a", "q4": "c"}
_HINTS = {"q1": "how many transactions, in how many files, A's fenced step really is",
          "q2": "what resource.db knows about generations",
          "q3": "what the one-file version's transaction held while A was paused",
          "q4": "where the fence must live relative to the write it protects"}


@task("03.2", "the two-database quiz", schedules([{"name": "the answer key"}], count=0, make=dict))
def quiz_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 03.2: ``answer() -> {"q1": "a".."d", ...}``."""
    got = answer()
    expect(isinstance(got, dict) and set(got) == set(QUIZ),
           f"the answer is a dict with exactly the keys {sorted(QUIZ)}", f"it returned {got!r}")
    letters = {q: str(v).strip().lower() for q, v in got.items()}
    odd = [q for q, v in sorted(letters.items()) if v not in ("a", "b", "c", "d")]
    expect(not odd, "every answer is one of the letters a, b, c, d", f"{odd[:1]} is {got[odd[0]]!r}" if odd else "")
    wrong = [q for q in sorted(QUIZ) if letters[q] != QUIZ[q]]
    expect(not wrong, f"every question is answered right ({len(QUIZ) - len(wrong)} of {len(QUIZ)} are)",
           "; ".join(f"{q}: think again about {_HINTS[q]}" for q in wrong))


# ---------------------------------------------------------------- 01.1: lost updates in a history

def _story(rng: random.Random, story: str) -> tuple[list, list]:
    """A recorded history and, known by construction, the writes whose work was lost."""
    events, lost, last, clock = [], [], {}, [rng.choice([0.0, 100.0, 3600.0])]

    def ev(worker, action, outcome="ok", gen=None, target=None, until=None):
        clock[0] += rng.choice([0.25, 0.5, 1.0, 1.5, 2.0, 5.0])
        events.append(Event(clock[0], worker, action, outcome, gen, target=target, until=until))
        if action == "write" and outcome == "ok":
            before = last.get(target)
            if before is not None and gen < before.generation:
                lost.append(before)
            last[target] = events[-1]

    def run(worker, gen, writes, outcome="ok"):
        ev(worker, "acquire", "ok", gen, "invoice-run", clock[0] + 10)
        for target in writes:
            ev(worker, "write", outcome, gen, target)
        ev(worker, "release", "ok", gen, "invoice-run")
    if story in ("source", "fenced"):
        ev("A", "acquire", "ok", 7, "invoice-run", clock[0] + 10)
        ev("A", "pause", until=clock[0] + 30)
        run("B", 8, ["INV-1", "INV-2"])
        ev("A", "resume")
        ev("A", "write", "ok" if story == "source" else "rejected", 7, "INV-1")
    elif story == "several":
        run("B", 8, ["INV-1", "INV-2", "INV-3"])
        ev("A", "write", "ok", 7, "INV-1")            # B's INV-1 is lost
        ev("A", "write", "ok", 7, "INV-1")            # A over A: nothing new lost
        run("C", 9, ["INV-1", "INV-2"])
        ev("A", "write", "rejected", 7, "INV-2")
        ev("B", "write", "ok", 8, "INV-2")            # C's INV-2 is lost
        ev("A", "write", "ok", 7, "INV-3")            # B's INV-3 is lost
        ev("A", "write", "ok", 7, "INV-4")            # nobody else wrote INV-4: nothing lost
    elif story == "clean":
        run("A", 7, ["INV-1", "INV-2"])
        run("B", 8, ["INV-1", "INV-1", "INV-3"])      # newer over older, equal over equal: fine
        ev("A", "write", "rejected", 7, "INV-1")
        ev("A", "write", "crashed", 7, "INV-3")
    else:
        names = rng.sample("ABCDEFGH", rng.randint(2, 5))
        gens = dict(zip(names, sorted(rng.sample(range(1, 60), len(names)))))
        targets = [f"INV-{i}" for i in rng.sample(range(1, 30), rng.randint(1, 4))]
        for _ in range(rng.randint(4, 30)):
            w = rng.choice(names)
            roll = rng.random()
            if roll < 0.2:
                ev(w, rng.choice(["acquire", "pause", "resume", "wait", "release"]), "ok", gens[w], "invoice-run")
            else:
                ev(w, "write", rng.choice(["ok"] * 6 + ["rejected", "crashed"]), gens[w], rng.choice(targets))
    return events, lost


LOST_HOSTILE = [{"name": "the source's story: A's 7 lands on B's 8", "story": "source"},
                {"name": "the same story behind a fence: A's write is rejected", "story": "fenced"},
                {"name": "three workers, three lost writes, and writes that look alike", "story": "several"},
                {"name": "a clean history with rejected and crashed writes", "story": "clean"}]


@task("01.1", "finding the lost updates", schedules(LOST_HOSTILE, count=40, make=lambda r: {"story": "random"}))
def lost_updates_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 01.1: ``answer(history) -> the committed writes whose work was lost``."""
    events, lost = _story(schedule.rng, schedule.knobs["story"])
    history.extend(events)
    got = answer(list(events))
    try:
        got = list(got)
    except TypeError:
        expect(False, "find_lost_updates returns a list of events", f"it returned {got!r}")
    foreign = [e for e in got if e not in events]
    expect(not foreign, "every event returned comes from the history", f"{foreign[0]!r} is not in it" if foreign else "")
    want = [i for i, e in enumerate(events) if e in lost]
    have = sorted({events.index(e) for e in got})
    show = lambda ids: ", ".join(f"{events[i].worker}'s {events[i].target} (gen {events[i].generation}, "
                                 f"t={events[i].time:g})" for i in ids) or "none"
    expect(have == want, "the lost writes are exactly the committed writes whose next committed write to the "
                         "same invoice carries a lower generation", f"expected {show(want)}; got {show(have)}")


# ---------------------------------------------------------------- 01.2: predicting the overwrite

def _overwrite_knobs(rng: random.Random) -> dict:
    ttl = rng.choice([0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.25, 60.0, 90.0])
    offset = rng.choice([-7.0, -1.0, -0.25, 0.0, 0.5, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 4.0, 20.0, 45.0])
    return {"pause": max(0.0, ttl + offset), "ttl": ttl}


OVERWRITE_HOSTILE = [
    {"name": "the source's numbers: pause 30 s, lease 10 s", "pause": 30.0, "ttl": 10.0},
    {"name": "a one-minute lease, same pause", "pause": 30.0, "ttl": 60.0},
    {"name": "a one-minute lease, a longer pause", "pause": 90.0, "ttl": 60.0},
    {"name": "A wakes up exactly when its lease expires", "pause": 10.0, "ttl": 10.0},
    {"name": "A wakes up just after B acquired, before B writes", "pause": 11.0, "ttl": 10.0},
    {"name": "A wakes up at the very instant B writes INV-1", "pause": 11.5, "ttl": 10.0},
    {"name": "A wakes up a quarter second after B wrote INV-1", "pause": 11.75, "ttl": 10.0},
    {"name": "a tiny lease and a short pause", "pause": 2.5, "ttl": 0.5},
    {"name": "no pause at all", "pause": 0.0, "ttl": 10.0},
]


@task("01.2", "predicting the overwrite", schedules(OVERWRITE_HOSTILE, count=24, make=_overwrite_knobs))
def overwrite_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 01.2: ``answer(pause, ttl) -> bool``, compared with a real unprotected run."""
    from .scenarios import expired_but_alive
    pause, ttl = schedule.knobs["pause"], schedule.knobs["ttl"]
    run = expired_but_alive(protected=False, pause=pause, ttl=ttl)
    history.extend(run.history)
    gens = {e.worker: e.generation for e in run.history if e.action == "acquire" and e.outcome == "ok"}
    final = {r["invoice_id"]: r["generation"] for r in run.tables["invoices"]}
    truth = final["INV-1"] == gens["A"]
    got = answer(pause, ttl)
    expect(isinstance(got, (bool, int)) and got in (0, 1), "predict_overwrite returns True or False",
           f"it returned {got!r}")
    expect(bool(got) == truth, f"the prediction matches the real run: with pause={pause:g} s and ttl={ttl:g} s, "
                               f"A {'does' if truth else 'does not'} overwrite B's INV-1",
           f"predict_overwrite({pause:g}, {ttl:g}) returned {got!r}; in the run, INV-1 ended with generation "
           f"{final['INV-1']}")


# ---------------------------------------------------------------- 04.1: an issuer that never goes backward

def _issue_knobs(rng: random.Random) -> dict:
    ops = []
    for _ in range(rng.randint(2, 5)):
        ops += ["issue"] * rng.randint(1, 4) + [rng.choice(["failover", "failover", "restore", "elsewhere"])]
    return {"ops": " ".join(ops + ["issue", "issue"])}


ISSUE_HOSTILE = [
    {"name": "a failover loses the last 3 tokens in flight", "ops": "issue issue issue issue issue failover:3 "
                                                                    "issue issue issue"},
    {"name": "last night's backup is restored after a million more tokens were issued",
     "ops": "issue issue elsewhere issue restore:1 issue issue"},
    {"name": "two recoveries: the second restores a backup from before the first",
     "ops": "issue issue issue failover:2 issue issue restore:1 issue issue"},
    {"name": "a failover that lost nothing (no lag)", "ops": "issue issue failover:0 issue"},
    {"name": "no recovery at all: the durable authority is not needed", "ops": "issue issue issue issue issue"},
]


@task("04.1", "the issuer that never goes backward", schedules(ISSUE_HOSTILE, count=12, make=_issue_knobs))
def issuer_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 04.1: ``answer(store, authority, name, recovered) -> (epoch, counter)``."""
    from .fence import token
    from .issuers import EpochAuthority
    rng = schedule.rng
    folder = tempfile.mkdtemp(prefix="labkit-check-")
    opened = []

    def open_(path):
        opened.append(_open(os.path.join(folder, path)))
        return opened[-1]
    try:
        name = f"invoice-run-{rng.randrange(1000)}"
        authority = EpochAuthority(open_("authority.db"))
        for _ in range(rng.randint(1, 4)):
            epoch = authority.next_epoch(name)
        store, stores, snapshots = open_("store-0.db"), [0], []
        execute(store, "CREATE TABLE IF NOT EXISTS epoch_counter (name TEXT PRIMARY KEY, "
                       "epoch INTEGER NOT NULL, counter INTEGER NOT NULL)")
        execute(store, "INSERT INTO epoch_counter VALUES (?, ?, ?)", (name, epoch, rng.randrange(10 ** 6)))
        highest, recovered, recoveries, t = token(_row(store, name)), False, 0, 0.0
        for op in schedule.knobs["ops"].split():
            what, _, arg = op.partition(":")
            t += 1.0
            if what == "issue":
                out = _call(answer, store, authority, name, recovered)
                expect(out[0] == "returned", "the issuer runs without an unexpected error", _shown(out))
                try:
                    got = token(out[1], "token")
                except Exception:
                    expect(False, "the issuer returns a token (epoch, counter)", f"it returned {out[1]!r}")
                history.append(Event(t, "issuer", "write", "ok", got, target=str(got)))
                history.append(Event(t, "issuer", "raise", "ok", got, target="token"))
                expect(got > highest, "every token is above every token issued before it, across failovers "
                                      "and restored backups (compared as (epoch, counter))",
                       f"it issued {got} after {highest} had been issued" + (" (just after a recovery)" if recovered else ""))
                expect(token(_row(store, name)) == got, "the token is committed in the store's epoch_counter row "
                       "before it is handed out", f"it returned {got}; the row holds {_row(store, name)}")
                highest, recovered = got, False
                snapshots.append(os.path.join(folder, f"snap-{len(snapshots)}.db"))
                execute(store, "VACUUM INTO ?", (snapshots[-1],))     # the whole store, as it is now
            elif what == "elsewhere":        # other holders drew many numbers from the same store
                bump = rng.choice([10 ** 6, 10 ** 9, 2 ** 40])
                execute(store, "UPDATE epoch_counter SET counter = counter + ? WHERE name = ?", (bump, name))
                highest = max(highest, token(_row(store, name)))
                history.append(Event(t, "others", "write", "ok", highest, target="token"))
            else:                            # failover to a lagging replica, or restore an old backup
                back = int(arg) if arg else rng.randint(0, 3) if what == "failover" else rng.randint(1, len(snapshots))
                source = snapshots[max(0, len(snapshots) - 1 - back)] if what == "failover" else snapshots[min(back, len(snapshots)) - 1]
                stores.append(len(stores))
                shutil.copyfile(source, os.path.join(folder, f"store-{stores[-1]}.db"))
                store, recovered, recoveries = open_(f"store-{stores[-1]}.db"), True, recoveries + 1
                history.append(Event(t, "operator", what, "ok", token(_row(store, name)), target="store"))
        used = authority.current(name) - epoch
        expect(used <= recoveries, "the durable authority is asked for a new epoch once per recovery, not for "
               "every token", f"{used} new epochs for {recoveries} recoveries")
    finally:
        for db in opened:
            db.conn.close()
        shutil.rmtree(folder, ignore_errors=True)


def _row(store, name: str):
    rows = execute(store, "SELECT epoch, counter FROM epoch_counter WHERE name = ?", (name,))
    return tuple(rows[0]) if rows else (0, 0)
