"""The fenced writers' laboratory, shared by tasks 02.1, 02.2 and 03.1.

:class:`Writers` runs a fenced writer's calls (one invoice for 02.1, a batch for 03.1) as the
stories of :mod:`labkit.grading.fenced` tell them: each call is logged (a replay draws it),
then judged against a model of an accepted or refused write (rows left, result, fence raised
first; no SQL, no evidence). B acts before A's n-th statement; if A holds the lock, B gets
"database is locked" and retries after.
"""

from __future__ import annotations

import contextlib
from random import Random
import re

from labkit.grading.diskfull import disk_full, is_full, long_id, short
from labkit.grading.lab import Tracer, busy, call, held_open, is_bool, scratch, shown
from labkit.db import execute
from labkit.grading import expect_all
from labkit.sim.history import Event

JOB, OTHER = "invoice-run", "payroll-run"
CRASH = "the disk is full: SQLite's own SQLITE_FULL"
ENDS = "every call ends its transaction with COMMIT or ROLLBACK, whatever happens"


#: the rules each call is judged by (``{gen}`` and ``{fence}`` filled in)
RULES = {
    "stale": "a write with generation {gen} is refused (returns False) and writes nothing when "
    "the fence is at {fence}",
    "accepted": "a write with generation {gen} is accepted (returns True) when the fence is at "
    "{fence} (equal generations pass)",
    "stores": "an accepted write stores its invoices, raises the fence of its own job to its "
    "generation, and changes nothing else",
    "clean": "a crash inside the transaction leaves nothing behind: no invoice stays, and the "
    "fence stays where it was",
    "propagates": "SQLite's 'database or disk is full' propagates to the caller as it was raised: "
    "SQLite has already rolled the transaction back, so an unconditional ROLLBACK fails and "
    "replaces it ('no transaction is active'; roll back only if labkit.db.in_transaction(conn)), "
    "and returning False would say the fence refused it",
    "locked": "a writer kept out by the lock lets SQLite's 'database is locked' propagate "
    "(returning False would say the fence refused it)",
}

SETUP = (  # no trigger on the written tables: it would give SQLite a statement journal
    "CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY, job_id TEXT NOT NULL, "
    "invoice_id TEXT NOT NULL, amount INTEGER NOT NULL, generation INTEGER NOT NULL)",
)


@contextlib.contextmanager
def lab(rng: Random, story: str):
    """A fresh SQLite file with the check's tables and the fences of JOB and OTHER.

    Yields (observer, {"A": (db, tracer), "B": (db, tracer)}, the starting generations).
    """
    with scratch() as tmp:
        observer = tmp.open()
        for sql in SETUP:
            execute(observer, sql)
        start = {JOB: 7 if story != "random" else rng.randint(1, 40)}
        start[OTHER] = rng.randint(20 if story == "elsewhere" else 1, 60)  # above JOB's, there
        for job, g in start.items():
            sql = "INSERT INTO job_fence(job_id, epoch, generation) VALUES (?, 0, ?)"
            execute(observer, sql, (job, g))
        yield observer, {w: (db, Tracer(db)) for w in "AB" for db in [tmp.open()]}, start


_WRITE = r"\s*(UPDATE(\s+OR\s+\w+)?|INSERT(\s+OR\s+\w+)?\s+INTO|REPLACE\s+INTO)\s+"
_RAISE = re.compile(_WRITE + r"[\[\"`]?job_fence\b", re.I)
_INTO = re.compile(_WRITE + r"[\[\"`]?invoices\b", re.I)
_TOUCH = re.compile(r"\b(invoices|charges)\b", re.I)


def _raised_first(sql: list[str]) -> list:
    """The check that the fence is raised before the statement that first reads or writes the
    protected table (none if no statement touched it)."""
    plain = [not s.lstrip().upper().startswith("PRAGMA") and "sqlite_master" not in s for s in sql]
    touch = next((i for i, s in enumerate(sql) if plain[i] and _TOUCH.search(s)), None)
    if touch is None:
        return []
    raised = next((i for i, s in enumerate(sql) if _RAISE.match(s)), None)
    first = raised is not None and raised < touch
    shown = " | ".join(s.strip().split("\n")[0][:70] for s in sql[: touch + 1])
    rule = (
        "the fence is raised before the protected state is read or written (the UPDATE of "
        "job_fence comes before the first statement that touches it)"
    )
    return [(first, rule, f"the statements were: {shown}", "fence first")]


def generation_of(db, job: str) -> int:
    """The generation in ``job``'s fence row."""
    return execute(db, "SELECT generation FROM job_fence WHERE job_id = ?", (job,))[0][0]


# ---------------------------------------------------------------- the model of a fenced write


def _state(db):
    fences = execute(db, "SELECT job_id, epoch, generation FROM job_fence ORDER BY job_id")
    rows = execute(db, "SELECT job_id, invoice_id, amount, generation FROM invoices ORDER BY 1, 2")
    return tuple(fences), tuple(rows)


def _after(state, job: str, gen: int, invoices: dict):
    """The state after an accepted write of ``invoices`` with ``gen``, or None if the fence refuses it."""
    fences, rows = state
    if gen < _fence(state, job):
        return None
    table = {(j, i): (a, g) for j, i, a, g in rows}
    table.update({(job, i): (a, gen) for i, a in invoices.items()})
    return (
        tuple((j, e, gen if j == job else g) for j, e, g in fences),
        tuple(sorted((j, i, a, g) for (j, i), (a, g) in table.items())),
    )


def _fence(state, job: str) -> int:
    return dict((j, g) for j, _, g in state[0])[job]


def _diff(before, after) -> str:
    if before == after:
        return "nothing changed"

    def changes(name, old: dict, new: dict) -> list[str]:
        keys = sorted(set(old) | set(new))
        return [
            f"{name(k)}: {old.get(k)} -> {new.get(k)}" for k in keys if old.get(k) != new.get(k)
        ]

    fence = [{j: g for j, _, g in state[0]} for state in (before, after)]
    rows = [{(j, i): (a, g) for j, i, a, g in state[1]} for state in (before, after)]
    parts = changes(lambda j: f"fence of {j}", *fence) + changes(
        lambda k: f"{k[1]} of {k[0]}", *rows
    )
    return "; ".join(parts) + " ((amount, generation))"


def locked_out(db) -> bool:
    """Whether another connection holds the write lock (the observer tries to take it)."""
    try:
        execute(db, "BEGIN IMMEDIATE")
    except Exception:  # busy: the write lock is taken
        return True
    execute(db, "ROLLBACK")
    return False


class Writers:
    """Runs a fenced-writer answer against the model of what an accepted or refused write does."""

    def __init__(self, answer, batch: bool, db, conns, history: list) -> None:
        self.answer, self.batch, self.db, self.conns = answer, batch, db, conns
        self.history, self.t = history, 0.0
        self.worked = False  # an accepted write was stored: from then on refusals are evidence

    def call(self, who: str, job: str, gen: int, invoices: dict):
        """``(out, the SQL the call sent, whether it left a transaction open)``."""
        db, tracer = self.conns[who]
        start = len(tracer.sql)
        if self.batch:
            out = call(self.answer, db, job, gen, dict(invoices))
        else:
            ((invoice, amount),) = invoices.items()
            out = call(self.answer, db, job, invoice, amount, gen)
        return out, tracer.sql[start:], db.conn.in_transaction

    def open(self) -> bool:
        """Whether a connection was left inside a transaction (the schedule cannot go on)."""
        return any(db.conn.in_transaction for db, _ in self.conns.values())

    def log(self, who, action, outcome="ok", gen=None, target=None, until=None, dt=1.0) -> None:
        self.t += dt
        self.history.append(Event(self.t, who, action, outcome, gen, target=target, until=until))

    def wrote(self, who: str, gen: int, invoices: dict, before, after, crashed=False) -> None:
        """Log a write as the rows show it, and the fence of JOB if it moved."""
        outcome = "crashed" if crashed else ("ok" if after != before else "rejected")
        self.log(who, "write", outcome, gen, ",".join(map(short, invoices)))
        if _fence(after, JOB) != _fence(before, JOB):
            self.log(who, "raise", "ok", _fence(after, JOB), JOB, dt=0.0)

    def judge(self, who, job, gen, invoices, before, ran, after, crashed=None) -> None:
        """Judge one call (already logged) that went from ``before`` to ``after``."""
        (out, sql, left_open), fence, diff = ran, _fence(before, job), _diff(before, after)
        what, want = (
            f"{who}'s call with generation {gen} {shown(out)}",
            _after(before, job, gen, invoices),
        )
        rule = {k: r.format(gen=gen, fence=fence) for k, r in RULES.items()}
        if crashed:
            saw = f"{short(crashed)} failed ({CRASH}); {diff}"
            checks = [(after == before, rule["clean"], saw, "all or nothing")]
            raised = out[0] == "raised" and is_full(out[1])
            checks += [(raised, rule["propagates"], what, "propagates")]
        elif want is None:
            checks = [
                (is_bool(out, False) and after == before, rule["stale"], f"{what}; {diff}", "stale")
            ]
        else:
            prop = "equal" if gen == fence else "newer"
            checks = [(is_bool(out, True), rule["accepted"], what, prop)]
            checks += [(after == want, rule["stores"], f"{what}: {diff}", prop)]
            self.worked = self.worked or after == want
        opened = f"{what} and left its transaction open: it still holds the write lock"
        self.history += [held_open(who, self.t - 0.5)] if left_open else []
        checks += [(not left_open, ENDS, opened, "ends"), *_raised_first(sql)]
        # a call is evidence if it sent SQL and wrote, or once the answer has done the task once:
        # refusing everything, with or without a SELECT, keeps no rule
        acted = bool(sql) and bool(crashed or self.worked or after != before)
        expect_all(checks, acted=acted, go_on=not left_open)  # judged on the rows it found

    def write(self, who: str, job: str, gen: int, invoices: dict, crash: str | None = None) -> dict:
        """One call on its own: log it as the rows show it, then judge it. With ``crash`` (an
        invoice of the batch) the disk is full when that invoice is written: it gets a
        :func:`long_id`. Returns the batch as written."""
        before = _state(self.db)
        if crash:
            name, crash = crash, long_id(self.db, crash)
            invoices = {(crash if i == name else i): a for i, a in invoices.items()}
        with disk_full(*self.conns[who]) if crash else contextlib.nullcontext():
            ran = self.call(who, job, gen, invoices)
        after, (_, sql, _) = _state(self.db), ran
        wrote = any(_INTO.match(s) for s in sql)  # a crash needs a write: raising is not one
        crashed = crash if wrote and _after(before, job, gen, invoices) is not None else None
        self.wrote(who, gen, invoices, before, after, crashed=bool(crashed))
        self.judge(who, job, gen, invoices, before, ran, after, crashed)
        return invoices

    def race(self, job: str, at: int, a_gen: int, b_gen: int, a_inv: dict, b_inv: dict) -> None:
        """A writes with ``a_gen``; B (``b_gen`` > ``a_gen``) acts just before A's ``at``-th statement."""
        s0, seen = _state(self.db), {}

        def b_acts():
            seen["mid"], seen["locked"] = _state(self.db), locked_out(self.db)
            seen["b"], seen["after"] = self.call("B", job, b_gen, b_inv), _state(self.db)

        self.conns["A"][1].before(at, b_acts)
        ran_a = self.call("A", job, a_gen, a_inv)
        self.conns["A"][1].action, s_a = None, _state(self.db)
        if not seen:  # A finished before its at-th statement: B comes after A
            self.wrote("A", a_gen, a_inv, s0, s_a)
            self.judge("A", job, a_gen, a_inv, s0, ran_a, s_a)
            return self.write("B", job, b_gen, b_inv)
        mid, ran_b, s_b, locked = seen["mid"], seen["b"], seen["after"], seen["locked"]
        if mid != s0:
            self.wrote("A", a_gen, a_inv, s0, mid)
        self.log("A", "pause", "ok", None, f"before its SQL statement {at}", until=self.t + 3.0)
        if locked:
            self.log("B", "wait", "busy", b_gen, JOB)
        else:
            self.wrote("B", b_gen, b_inv, mid, s_b)
        self.log("A", "resume")
        if mid == s0:
            self.wrote("A", a_gen, a_inv, s_b, s_a)
        saw = f"just before A's statement {at}, another connection saw: {_diff(s0, mid)}"
        together = "a call's writes become visible together, at its COMMIT"
        checks = [(mid in (s0, _after(s0, job, a_gen, a_inv)), together, saw, "all or nothing")]
        if locked:  # A holds the write lock: B is kept out, A commits whole, B tries again after
            checks += [(busy(ran_b[0]), RULES["locked"], f"B {shown(ran_b[0])}", "propagates")]
            nothing = "a writer kept out by the lock writes nothing"
            checks += [(s_b == mid, nothing, f"B: {_diff(mid, s_b)}", "all or nothing")]
            expect_all(checks, acted=s_a != s0, go_on=not self.open())
            self.judge("A", job, a_gen, a_inv, s0, ran_a, s_a)
            return self.write("B", job, b_gen, b_inv)
        expect_all(checks, acted=s_a != s0, go_on=not self.open())
        self.judge("B", job, b_gen, b_inv, mid, ran_b, s_b)
        if mid == s0:  # B got in before A wrote anything: A is judged after B
            return self.judge("A", job, a_gen, a_inv, s_b, ran_a, s_a)
        if mid == (_after(s0, job, a_gen, a_inv) or mid):  # B saw half a call: all or nothing
            self.judge("A", job, a_gen, a_inv, s0, ran_a, mid)  # broke, and A is not judged again
