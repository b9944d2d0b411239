"""Grading checks of exercise 02 (registered in :mod:`labkit.grading`).

* 02.1 the fenced insert: run by :func:`labkit.grading.writers.fenced_trial`.
* 02.2 one charge per operation key: every call is judged against the rows it
  left (the fence decides first, then the key); the runner's repeat arrives on a
  second connection just before the first attempt's n-th SQL statement.
"""

from __future__ import annotations

from random import Random

from labkit.grading.lab import busy, call, shown
from labkit.grading.writers import FENCED_HOSTILE, JOB, OTHER, fenced_trial, generation_of, lab
from labkit.db import execute
from labkit.grading import BOOL, NONE, Schedule, expect, hostile, task
from labkit.sim.history import Event


@task("02.1", "the fenced insert", FENCED_HOSTILE, count=16, returns=BOOL)
def fenced_insert_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 02.1: ``answer(conn, job, invoice_id, amount, generation) -> bool``."""
    fenced_trial(answer, schedule, history, batch=False)


# ---------------------------------------------------------------- 02.2: one charge per operation key


def _charges(db):
    fences = execute(db, "SELECT job_id, generation FROM job_fence ORDER BY job_id")
    rows = execute(db, "SELECT id, job_id, invoice_id, amount, generation FROM charges ORDER BY id")
    return tuple(fences), tuple(rows)


class _Charger:
    """Runs a charge_once answer; ``done`` maps each committed key to its charge's id."""

    def __init__(self, answer, db, conns, history: list) -> None:
        self.answer, self.db, self.conns, self.history = answer, db, conns, history
        self.done, self.t = {}, 0.0

    def call(self, who: str, req: tuple):
        return call(self.answer, self.conns[who][0], *req)

    def log(self, who, req, outcome, action: str = "charge", until=None) -> None:
        self.t += 1.0
        gen, key, invoice = (req[4], req[1], req[2]) if req else (None, None, None)
        event = Event(self.t, who, action, outcome, gen, key=key, target=invoice, until=until)
        self.history.append(event)

    def raised(self, who: str, before, after) -> None:
        """Log the fence of JOB if it moved."""
        old, new = dict(before[0]).get(JOB), dict(after[0]).get(JOB)
        if old != new:  # logged with the charge that comes next
            self.history.append(Event(self.t + 1.0, who, "raise", "ok", new, target=JOB))

    def step(self, who: str, req: tuple, before, out, after, crashed: bool = False):
        """Judge one call that went from ``before`` to ``after``; ``out=None``: not returned yet."""
        job, key, invoice, amount, gen = req
        fence, what = dict(before[0])[job], f"{who}'s charge_once(key={key!r}, generation={gen})"
        got = out and shown(out)
        new = [r for r in after[1] if r not in before[1]]
        self.raised(who, before, after)
        if crashed or gen < fence:
            self.log(who, req, "crashed" if crashed else ("ok" if new else "rejected"))
            why = (
                "a crash inside the transaction leaves no charge, no key and the fence where it was"
                if crashed
                else f"a charge with generation {gen} below the fence ({fence}) is refused: it returns None, "
                "charges nothing and records no key (the fence decides first, even for a key already used)"
            )
            expect(
                after == before,
                why,
                f"{what} {got}; charges added {new}, fence {dict(after[0])[job]}",
            )
            expect(
                crashed and out[0] == "raised" or out == ("returned", None), why, f"{what} {got}"
            )
            return None
        raised = tuple((j, gen if j == job else g) for j, g in before[0])
        expect(
            after[0] == raised,
            "an accepted call raises the fence of its job to its generation (and no other)",
            f"{what}: fence {before[0]} -> {after[0]}",
        )
        if key in self.done:
            self.log(who, req, "duplicate" if not new else "ok")
            expect(
                not new,
                f"a repeat of key {key!r} charges nothing: only the first call takes effect",
                f"{what} added {new} after the key's charge {self.done[key]} committed",
            )
            expect(
                out is None or out == ("returned", self.done[key]),
                "a repeat returns the id of the key's first charge",
                f"{what} {got}, the first was {self.done[key]}",
            )
            return self.done[key]
        self.log(who, req, "ok" if new else "rejected")
        expect(
            len(new) == 1 and new[0][1:] == (job, invoice, amount, gen),
            "the first call with a key charges exactly once, with its job, invoice, amount and generation",
            f"{what} added {new}",
        )
        expect(
            out is None or out == ("returned", new[0][0]),
            "charge_once returns the id of the charge it made",
            f"{what} {got}; the new charge has id {new[0][0]}",
        )
        self.done[key] = new[0][0]
        return new[0][0]

    def solo(self, who: str, req: tuple, crash: bool = False) -> None:
        db = self.conns[who][0]
        before = _charges(self.db)
        if crash:
            execute(self.db, "INSERT INTO crash_plan VALUES (?)", (req[2],))
        out = self.call(who, req)
        expect(
            not db.conn.in_transaction,
            "every call ends its transaction with COMMIT or ROLLBACK",
            f"{who}'s call {shown(out)} and left its transaction open",
        )
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
        if mid != s0:  # A had committed before the repeat came
            self.step("A", req, s0, None, mid)
        self.log("A", None, "ok", "pause", until=self.t + 3.0)
        if out_b[0] == "returned" and out_b[1] is not None:
            self.step("B", req, mid, out_b, s_b)
            self.log("A", None, "ok", "resume")
            self.step("A", req, s_b, out_a, s_a)
            return
        self.log("B", req, "busy", "wait")
        self.log("A", None, "ok", "resume")
        expect(
            busy(out_b) or out_b == ("returned", None),
            "a repeat kept out by the lock waits ('database is locked' at busy timeout 0)",
            f"the repeat {shown(out_b)}",
        )
        expect(
            s_b == mid,
            "a repeat kept out by the lock changes nothing",
            f"charges {mid[1]} -> {s_b[1]}",
        )
        if mid == s0:
            self.step("A", req, s0, out_a, s_a)
        self.solo("B", req)


def _key(rng: Random, n: int) -> str:
    return f"bill/INV-{n}/{rng.randrange(16**6):06x}"


_RACE = "the repeat arrives just before the first attempt's statement {}"
ONCE_HOSTILE = hostile(
    "story at",
    ("the runner repeats a charge twice (same key, generation 8)", "repeat"),
    ("a stale charge is refused and leaves its key free for the owner", "stale"),
    ("a crash inside the transaction, then the retry", "crash"),
    *((_RACE.format(n), "race", n) for n in range(1, 7)),
    ("B (8) takes over and repeats A's finished charge", "successor"),
)


@task("02.2", "the charge that happens once per key", ONCE_HOSTILE, count=14, returns=(int, NONE))
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
