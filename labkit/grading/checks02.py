"""Grading checks of exercise 02 (registered in :mod:`labkit.grading`).

* 02.1 the fenced insert: run by :func:`labkit.grading.fenced.fenced_trial`.
* 02.2 one charge per operation key: every call is judged against the rows it
  left (the fence decides first, then the key); the runner's repeat arrives on a
  second connection just before the first attempt's n-th SQL statement.
"""

from __future__ import annotations

import contextlib
from random import Random
import re

from labkit.grading.diskfull import disk_full, is_full, long_id, short
from labkit.grading.lab import busy, call, held_open, shown
from labkit.grading.fenced import FENCED_HOSTILE, fenced_trial
from labkit.grading.writers import JOB, OTHER, generation_of, lab
from labkit.grading.writers import ENDS, locked_out
from labkit.db import execute
from labkit.grading import BOOL, NONE, Schedule, expect_all, hostile, task
from labkit.sim.history import Event


FENCED = {
    "newer": "a write with a generation above the fence returns True, stores its invoice and "
    "raises the fence of its own job (and nothing else)",
    "equal": "a write with the generation the fence already holds is accepted the same way",
    "stale": "a write with a generation below the fence returns False and writes nothing, "
    "even when it races another writer",
    "fence first": "the fence is raised before anything reads or writes the invoice",
    "ends": "every call ends its transaction with COMMIT or ROLLBACK",
    "all or nothing": "the fence's raise and the invoice commit together: no one sees one "
    "without the other, and a crash leaves neither",
    "propagates": "an error (a full disk, 'database is locked') reaches the caller as raised, "
    "not replaced by a failed ROLLBACK, and is not returned as False",
}


@task("02.1", "the fenced insert", FENCED_HOSTILE, count=12, returns=BOOL, properties=FENCED)
def fenced_insert_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 02.1: ``answer(conn, job, invoice_id, amount, generation) -> bool``."""
    fenced_trial(answer, schedule, history, batch=False)


# ---------------------------------------------------------------- 02.2: one charge per operation key


ONCE = {
    "stale": "a charge with a generation below the fence returns None, charges nothing and "
    "records no key, even for a key already used",
    "first": "the first accepted call with a key raises its job's fence, charges exactly once "
    "and returns the new charge's id",
    "repeat": "a repeat of a key passes the fence like any call, charges nothing and returns "
    "the id of the key's first charge",
    "ends": "every call ends its transaction with COMMIT or ROLLBACK",
    "rolls back": "a crash leaves no charge, no key and the fence where it was, so the retry charges",
    "propagates": "an error (a full disk, 'database is locked') reaches the caller as raised, "
    "not replaced by a failed ROLLBACK, and is not returned as None",
}
_RULES = {
    "stale": "a charge with generation {gen} below the fence ({fence}) is refused: it returns None, "
    "charges nothing and records no key (the fence decides first, even for a key already used)",
    "propagates": "SQLite's 'database or disk is full' propagates as it was raised (if SQLite "
    "already rolled back, a second ROLLBACK fails and replaces it: roll back only if "
    "labkit.db.in_transaction(conn)); None would say the fence refused it",
    "raises": "an accepted call raises the fence of its job to its generation (and no other)",
    "nothing": "a repeat of key {key!r} charges nothing: only the first call takes effect",
    "same id": "a repeat returns the id of the key's first charge",
    "once": "the first call with a key charges exactly once, with its job, invoice, amount and "
    "generation",
    "its id": "charge_once returns the id of the charge it made",
    "locked": "a repeat kept out by the lock lets 'database is locked' propagate (at busy timeout 0)",
}
_INTO = re.compile(r"\s*(INSERT(\s+OR\s+\w+)?|REPLACE)\s+INTO\s+[\[\"`]?charges\b", re.I)


def _charges(db):
    fences = execute(db, "SELECT job_id, generation FROM job_fence ORDER BY job_id")
    rows = execute(db, "SELECT id, job_id, invoice_id, amount, generation FROM charges ORDER BY id")
    keys = execute(db, "SELECT key, result FROM idempotency_keys ORDER BY key")
    return tuple(fences), tuple(rows), tuple(keys)


class _Charger:
    """Runs a charge_once answer; ``done`` maps each committed key to its charge's id."""

    def __init__(self, answer, db, conns, history: list) -> None:
        self.answer, self.db, self.conns, self.history = answer, db, conns, history
        self.done, self.t, self.worked = {}, 0.0, False

    def call(self, who: str, req: tuple):
        """``(out, the SQL the call sent, whether it left a transaction open)``."""
        db, tracer = self.conns[who]
        start = len(tracer.sql)
        out = call(self.answer, db, *req)
        return out, tracer.sql[start:], db.conn.in_transaction

    def log(self, who, req, outcome, action: str = "charge", until=None) -> None:
        self.t += 1.0
        gen, key, invoice = (req[4], req[1], req[2]) if req else (None, None, None)
        target = invoice and short(invoice)
        event = Event(self.t, who, action, outcome, gen, key=key, target=target, until=until)
        self.history.append(event)

    def step(self, who: str, req: tuple, before, ran, after, crashed: bool = False) -> None:
        """Log, then judge, one call that went from ``before`` to ``after``."""
        job, key, invoice, amount, gen = req
        (out, sql, left_open), fence = ran, dict(before[0])[job]
        what = f"{who}'s charge_once(key={key!r}, generation={gen}) {shown(out)}"
        new = [r for r in after[1] if r not in before[1]]
        old, moved = dict(before[0]).get(JOB), dict(after[0]).get(JOB)
        if old != moved:  # logged with the charge that comes next
            self.history.append(Event(self.t + 1.0, who, "raise", "ok", moved, target=JOB))
        repeat, first = key in self.done and gen >= fence, self.done.get(key)
        outcome = "duplicate" if repeat and not new else "ok" if new else "rejected"
        self.log(who, req, "crashed" if crashed else outcome)
        rule = {k: r.format(gen=gen, fence=fence, key=key) for k, r in _RULES.items()}
        seen = f"{what}; charges added {new}, fence {dict(after[0])[job]}"
        if crashed:
            checks = [(after == before, ONCE["rolls back"], seen, "rolls back")]
            checks += [
                (out[0] == "raised" and is_full(out[1]), rule["propagates"], what, "propagates")
            ]
        elif gen < fence:
            checks = [(after == before and out == ("returned", None), rule["stale"], seen, "stale")]
        else:
            prop = "repeat" if repeat else "first"
            raised = tuple((j, gen if j == job else g) for j, g in before[0])
            moved = f"{what}: fence {before[0]} -> {after[0]}"
            checks = [(after[0] == raised, rule["raises"], moved, prop)]
            if repeat:
                again = f"{seen} after the key's charge {first} committed"
                checks += [(not new, rule["nothing"], again, prop)]
                same = out == ("returned", first)
                checks += [(same, rule["same id"], f"{what}, the first was {first}", prop)]
            else:
                made = len(new) == 1 and new[0][1:] == (job, invoice, amount, gen)
                checks += [(made, rule["once"], seen, prop)]
                checks += [(made and out == ("returned", new[0][0]), rule["its id"], seen, prop)]
                self.worked = self.worked or made
        opened = f"{what} and left its transaction open"
        acted = bool(sql) and bool(crashed or self.worked or after != before)  # as in writers
        checks.append((not left_open, ENDS, opened, "ends"))
        self.history += [held_open(who, self.t - 0.5)] if left_open else []
        expect_all(checks, acted=acted, go_on=not left_open)
        if not crashed and not repeat and gen >= fence and new:
            self.done[key] = new[0][0]

    def solo(self, who: str, req: tuple, crash: bool = False) -> None:
        before = _charges(self.db)
        if crash:  # the disk is full when the charge is written: its invoice id needs new pages
            req = (*req[:2], long_id(self.db, req[2]), *req[3:])
        with disk_full(*self.conns[who]) if crash else contextlib.nullcontext():
            ran = self.call(who, req)
        (_, sql, _), after = ran, _charges(self.db)
        wrote = any(_INTO.match(s) for s in sql)  # a crash needs a write: raising is not one
        crashed = crash and wrote and req[4] >= dict(before[0])[req[0]] and req[1] not in self.done
        self.step(who, req, before, ran, after, crashed=crashed)

    def race(self, req: tuple, at: int) -> None:
        """A sends ``req``; the runner's repeat (same request, B's connection) comes before A's ``at``-th statement."""
        s0, seen = _charges(self.db), {}

        def b_acts():
            seen["mid"], seen["locked"] = _charges(self.db), locked_out(self.db)
            seen["b"], seen["after"] = self.call("B", req), _charges(self.db)

        self.conns["A"][1].before(at, b_acts)
        ran_a = self.call("A", req)
        self.conns["A"][1].action = None
        s_a = _charges(self.db)
        if not seen:
            self.step("A", req, s0, ran_a, s_a)
            return self.solo("B", req)
        mid, ran_b, s_b, locked = seen["mid"], seen["b"], seen["after"], seen["locked"]
        if mid != s0:  # A had committed before the repeat came
            self.step("A", req, s0, ran_a, mid)
        self.log("A", None, "ok", "pause", until=self.t + 3.0)
        if locked:
            self.log("B", req, "busy", "wait")
        else:
            self.step("B", req, mid, ran_b, s_b)
        self.log("A", None, "ok", "resume")
        if locked:
            waited = (
                busy(ran_b[0]),
                _RULES["locked"],
                f"the repeat {shown(ran_b[0])}",
                "propagates",
            )
            saw = f"charges {mid[1]} -> {s_b[1]}"
            expect_all(
                [
                    waited,
                    (s_b == mid, "a repeat kept out by the lock changes nothing", saw, "repeat"),
                ],
                acted=s_a != s0,
                go_on=not any(db.conn.in_transaction for db, _ in self.conns.values()),
            )
        if mid == s0:
            self.step("A", req, s_b, ran_a, s_a)
        if locked:
            self.solo("B", req)


def _key(rng: Random, n: int) -> str:
    return f"bill/INV-{n}/{rng.randrange(16**6):06x}"


_RACE = "the repeat arrives just before the first attempt's statement {}"
ONCE_HOSTILE = hostile(
    "story at each",
    ("the runner repeats a charge twice (same key, generation 8)", "repeat"),
    ("a stale repeat and a stale charge are refused; the key stays free for the owner", "stale"),
    ("a crash inside the transaction, then the retry", "crash"),
    *((_RACE.format(n), "race", n) for n in range(1, 6)),
    (_RACE.format(6) + ", and each later one it reaches", "race", 6, "at"),
    ("B (8) takes over and repeats A's finished charge", "successor"),
)


@task(
    "02.2",
    "the charge that happens once per key",
    ONCE_HOSTILE,
    count=10,
    returns=(int, NONE),
    properties=ONCE,
)
def charge_once_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 02.2: ``answer(conn, job, key, invoice_id, amount, generation) -> charge id | None``."""
    rng, story = schedule.rng, schedule.knobs["story"]
    with lab(rng, story) as (db, conns, _):
        c, n = _Charger(answer, db, conns, history), [0]

        def req(gen, job=JOB):
            n[0] += 1
            return (job, _key(rng, n[0]), f"INV-{n[0]}", rng.randrange(100, 990, 5), gen)

        if story == "repeat":
            first = req(8)
            for _ in range(3):
                c.solo("B", first)
        elif story == "stale":
            first = req(8)
            c.solo("B", first)
            c.solo("A", first[:4] + (7,))  # a stale repeat of a finished charge: None, not its id
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
                cur, roll = generation_of(db, job), rng.random()
                if made and roll < 0.35:
                    old = rng.choice(made)
                    who, gen = (
                        rng.choice("AB"),
                        generation_of(db, old[0]) + rng.choice([-1, 0, 0, 1]),
                    )
                    c.solo(who, old[:4] + (max(gen, 0),))
                elif roll < 0.55:
                    made.append(req(cur, job))
                    c.race(made[-1], rng.randint(1, 7))
                else:
                    made.append(req(max(0, cur + rng.choice([-2, 0, 0, 0, 1])), job))
                    c.solo(rng.choice("AB"), made[-1], crash=roll > 0.9)
