"""Grading checks of exercise 07 (registered in :mod:`labkit.grading`).

* 07.1 the careful sweeper: old unfinished claims are requeued, while their
  owner checkpoints, finishes or loses the claim between the sweeper's statements.
* 07.2 resuming with operation ids: the worker dies at a chosen statement
  (:func:`~labkit.grading.lab.process`) and a successor resumes; no invoice may
  be issued twice.
"""

from __future__ import annotations

from itertools import pairwise
from random import Random

from labkit.clock import VirtualClock
from labkit.db import execute
from labkit.grading import Schedule, expect_all, hostile, task
from labkit.grading.lab import between_statements, process, scratch
from labkit.sim.history import Event

# ---------------------------------------------------------------- 07.1 sweeper


def _sweep_knobs(rng: Random) -> dict:
    return {
        "jobs": rng.randint(3, 8),
        "mover": rng.choice(["checkpoint", "finish", "taken"]),
        "inject_at": rng.randrange(0, 5),
        "older_than": rng.choice([10.0, 30.0, 60.0]),
    }


SWEEP_HOSTILE = hostile(
    "jobs mover inject_at older_than",
    ("old unfinished, fresh, finished and queued claims; nobody moves", 6, None, 0, 30.0),
    ("B checkpoints progress just before the sweeper's 2nd statement", 4, "checkpoint", 2, 30.0),
    ("B finishes its job just before the sweeper's 2nd statement", 4, "finish", 2, 30.0),
    (
        "another sweeper requeues and C claims, before the sweeper's 2nd statement",
        4,
        "taken",
        2,
        30.0,
    ),
    ("B checkpoints just before the sweeper's 3rd statement", 5, "checkpoint", 3, 10.0),
    ("B finishes just before the sweeper's 1st statement", 3, "finish", 1, 60.0),
)


_MIX = ["stale", "stale", "fresh", "done", "queued"]  # the kinds of the claims beyond four
_WHAT = {"fresh": "recently updated by its owner", "done": "finished", "queued": "already queued"}


def _claim_rows(db) -> dict:
    rows = execute(db, "SELECT job, owner, state, progress FROM claims ORDER BY job")
    return {r[0]: r[1:] for r in rows}


def _judge(checks: list) -> None:
    """Judge every ``(prop, held, rule, detail)`` check of one run (see ``expect_all``)."""
    expect_all([(held, rule, detail, prop) for prop, held, rule, detail in checks])


@task(
    "07.1", "the careful sweeper", SWEEP_HOSTILE, count=16, make=_sweep_knobs, returns=(list, tuple),
    properties={
        "requeues old": "every old unfinished claim is requeued",
        "keeps progress": "a requeued claim keeps its progress",
        "owner cleared": "a requeued claim has its owner cleared",
        "leaves others": "fresh, finished and queued claims are left alone",
        "unchanged only": "a claim that moved on after it was read is never requeued",
        "returns jobs": "the sweeper returns exactly the jobs it requeued",
    },
)  # fmt: skip
def sweep_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 07.1: ``answer(db, now, older_than) -> list of requeued jobs``."""
    from labkit.mechanisms.recovery import Claims

    rng, k = schedule.rng, schedule.knobs
    older = k["older_than"]
    with scratch() as tmp:
        db, other = tmp.open(), tmp.open()
        clock = VirtualClock(rng.uniform(1000, 5000))
        claims = Claims(other, clock)
        kinds = ["stale", "fresh", "done", "queued"] if k["jobs"] >= 4 else ["stale"] * 2 + ["done"]
        kinds += [rng.choice(_MIX) for _ in range(k["jobs"] - 4)]
        rng.shuffle(kinds)
        jobs = [f"run-{rng.randrange(10_000)}-{i}" for i in range(len(kinds))]
        for i, (job, kind) in enumerate(zip(jobs, kinds)):  # the old ones first, at old times
            if kind in ("stale", "done"):
                claims.enqueue(job)
                c = claims.claim(job, rng.choice("BDEF"), 7 + i)
                history.append(
                    Event(clock.now(), c.owner, "acquire", "ok", c.generation, target=job)
                )
                for _ in range(rng.randrange(0, 3)):
                    c = claims.checkpoint(c, c.progress + 1)
                if kind == "done":
                    claims.finish(c)
            clock.advance(rng.uniform(0.1, 1.0))
        clock.advance(older + rng.uniform(1, 20))
        for i, (job, kind) in enumerate(zip(jobs, kinds)):  # then the fresh ones
            if kind in ("fresh", "queued"):
                claims.enqueue(job)
                if kind == "fresh":
                    c = claims.claim(job, rng.choice("BDEF"), 20 + i)
                    claims.checkpoint(c, 1)
        clock.advance(rng.uniform(0.1, older / 2))
        now, before = clock.now(), _claim_rows(db)
        stale = [j for j, kind in zip(jobs, kinds) if kind == "stale"]
        moved = rng.choice(stale) if stale and k["mover"] else None

        def move() -> bool:
            if _claim_rows(other)[moved] != before[moved]:  # the sweeper wrote it already: it
                return False  # cannot move on after it was read (the claim was requeued first)
            c = claims.get(moved)
            if k["mover"] == "checkpoint":
                claims.checkpoint(c, c.progress + 1)
            elif k["mover"] == "finish":
                claims.finish(c)
            else:
                claims.requeue(c)
                claims.claim(moved, "C", 99)
            who, what = c.owner if k["mover"] != "taken" else "C", f"{moved} ({k['mover']})"
            history.append(Event(clock.now(), who, "write", "ok", c.generation, target=what))
            seen["after"] = _claim_rows(other)[moved]
            return True

        seen = {"after": None}
        with between_statements(db, k["inject_at"] if moved else 0, move) as race:
            got = answer(db, now, older)
        after, raced = _claim_rows(db), moved if race["done"] else None
        world = dict(before, **({raced: seen["after"]} if raced else {}))  # had it done nothing
        mine = sorted(j for j in jobs if after[j][1] == "queued" != world[j][1])  # it requeued
        for job in mine:
            history.append(Event(now, "sweeper", "write", "ok", target=f"{job} requeued"))
        acted, checks = after != world, []
        # fmt: off
        for job, kind in zip(jobs, kinds):
            seen = f"{job}: before {before[job]}, after {after[job]}"
            if job == raced and acted:
                checks.append(("unchanged only", after[job] == world[job],
                    "the sweeper never requeues a claim that moved on after it was read",
                    f"it was old, but its claim moved on ({k['mover']}) while the sweeper ran; {seen}"))
            elif kind == "stale" and job != raced:
                checks.append(("requeues old", after[job][1] == "queued", ("the sweeper requeues "
                               f"every claim unfinished and untouched for more than {older:g} s"), seen))
                if after[job][1] == "queued":
                    checks.append(("keeps progress", after[job][2] == before[job][2],
                                   "the sweeper requeues an old claim keeping its progress", seen))
                    checks.append(("owner cleared", after[job][0] is None,
                                   "a requeued claim has its owner cleared (owner NULL)", seen))
            elif kind != "stale" and acted:
                checks.append(("leaves others", after[job] == before[job],
                               f"the sweeper leaves a claim that is {_WHAT[kind]} alone", seen))
        if mine or got:
            ok = isinstance(got, (list, tuple)) and sorted(map(repr, got)) == sorted(map(repr, mine))
            checks.append(("returns jobs", ok, "the sweeper returns the jobs it requeued",
                           f"it returned {got!r}, requeued {mine}"))
        # fmt: on
        _judge(checks)


# ---------------------------------------------------------------- 07.2 resume with operation ids


def _resume_knobs(rng: Random) -> dict:
    return {
        "units": rng.randint(3, 9),
        "every": rng.choice([2, 3, 4]),
        "dies_after": rng.choice([0, rng.randint(1, 8)]),
        "statement": rng.randint(1, 40),
    }


RESUME_HOSTILE = hostile(
    "units every dies_after statement takeover ahead",
    ("B dies just after its 4th invoice commits, before the checkpoint catches up", 6, 3, 4, 0),
    ("B dies just after its 2nd invoice commits", 5, 4, 2, 0),
    ("B dies at its 3rd SQL statement", 4, 2, 0, 3),
    ("nobody dies", 7, 3, 0, 0),
    ("B dies once its progress runs ahead of the invoices it issued", 6, 3, 0, 0, 0, 1),
    ("B pauses after its 1st invoice; C (8) takes the job over; stale B wakes up", 6, 3, 0, 0, 1),
    ("B pauses after its 2nd invoice; C (8) takes the job over; stale B wakes up", 5, 4, 0, 0, 2),
)


@task(
    "07.2", "resuming with operation ids", RESUME_HOSTILE, count=12, make=_resume_knobs,
    properties={
        "own transaction": "each unit's invoice commits in a fenced transaction of its own",
        "stale refused": "a stale worker's step is refused by the fence and writes nothing",
        "checkpoint in tx": "the checkpoint commits in the same transaction as its unit's invoice",
        "checkpoints rarely": "progress is checkpointed at most once per batch of units",
        "no repeat": "a retry never issues a unit's invoice twice",
        "every unit": "every unit of the job gets its invoice",
        "finishes": "the job ends done, with its progress at the number of units",
    },
)  # fmt: skip
def resume_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 07.2: ``answer(claims, claim, units, issue_invoice, *, every)``."""
    from labkit.errors import LeaseLost, StaleGeneration
    from labkit.fence import Fence
    from labkit.mechanisms.recovery import Claims

    rng, k, stopped = schedule.rng, schedule.knobs, (StaleGeneration, LeaseLost)
    job = f"invoice-run-{rng.randrange(1000)}"
    units = [(f"c{i + 1}", rng.randrange(50, 500)) for i in range(k["units"])]
    checks: list = []
    with scratch() as tmp:
        admin = tmp.open()
        execute(
            admin,
            "CREATE TABLE issued (number INTEGER PRIMARY KEY AUTOINCREMENT, unit TEXT NOT NULL, "
            "amount INTEGER NOT NULL, generation INTEGER NOT NULL)",
        )
        clock = VirtualClock(rng.uniform(0, 100))
        desk = Claims(admin, clock)
        desk.enqueue(job)

        def issue_invoice(tx, unit, amount):
            """The billing effect: every call issues a NEW invoice number."""
            number = tx.execute(
                "INSERT INTO issued(unit, amount, generation) VALUES (?, ?, ?) RETURNING number",
                (unit, amount, tx.token[1]),
            )[0][0]
            tx.execute(
                "INSERT INTO invoices(job_id, invoice_id, amount, generation) VALUES (?, ?, ?, ?)",
                (job, f"INV-{number}", amount, tx.token[1]),
            )
            return number

        def issued() -> int:
            return execute(admin, "SELECT COUNT(*) FROM issued")[0][0]

        def log(owner: str, since: int) -> int:
            """Draw the invoices issued after number ``since``; return the last one's number."""
            sql = "SELECT number, unit, generation FROM issued WHERE number > ?"
            for number, unit, g in execute(admin, sql, (since,)):
                key, what = f"{job}/{unit}", f"INV-{number} ({unit})"
                history.append(Event(clock.now(), owner, "write", "ok", g, key=key, target=what))
                since = number
            return since

        def take_over(seen: dict) -> None:
            """B is paused: the sweeper requeues its job, C (8) claims it and raises the fence."""
            seen["claim"] = desk.get(job)
            clock.advance(60)
            desk.sweep(older_than=30)
            seen["C"] = desk.claim(job, "C", 8)
            with Fence(admin, job).guard(8):
                history.append(Event(clock.now(), "C", "acquire", "ok", 8, target=job))

        def run(owner: str, generation: int, dies_after=0, statement=0, takeover=0, claim=None):
            conn = tmp.open()
            if claim is None:
                claim = Claims(conn, clock).claim(job, owner, generation)
                history.append(Event(clock.now(), owner, "acquire", "ok", generation, target=job))
            start = issued()
            count = {"sql": 0, "marks": [], "after": 0, "logged": start}

            def dies(sql: str) -> bool:
                count["sql"] += 1
                word = sql.lstrip()[:6].upper().strip()
                done = issued() - start if word in ("COMMIT", "BEGIN") else 0
                if word == "COMMIT":
                    count["marks"].append((issued(), desk.get(job).progress))
                if takeover and "C" not in count and word == "BEGIN" and done >= takeover:
                    count["logged"] = count["mark"] = log(owner, count["logged"])
                    take_over(count)
                count["after"] += "C" in count
                ahead = owner == "B" and word == "BEGIN" and k.get("ahead")  # its checkpoint
                ahead = ahead and desk.get(job).progress > claim.progress + done  # ran ahead
                return (statement and count["sql"] >= statement) or (
                    dies_after and done >= dies_after or ahead
                )

            mine = Claims(conn, clock)
            try:
                with process(conn, dies) as fate:
                    try:
                        answer(mine, claim, list(units), issue_invoice, every=k["every"])
                    except Exception as exc:  # died, or stopped as a stale worker
                        if not (fate["dead"] or "C" in count and isinstance(exc, stopped)):
                            raise
                        count["stopped"] = type(exc).__name__
            finally:
                conn.conn.close()
            log(owner, count["logged"])
            if fate["dead"]:
                history.append(Event(clock.now(), owner, "crash", "ok"))
            elif "stopped" in count:
                stop = Event(
                    clock.now(), owner, "write", "rejected", generation, target=count["stopped"]
                )
                history.append(stop)
            after = count.get("claim") or desk.get(job)
            bumps = after.version - claim.version - (after.state == "done")
            todo, every = len(units) - claim.progress, k["every"]
            marks = count["marks"] + [(issued(), desk.get(job).progress)]
            steps = [(b[0] - a[0], b[1] != a[1]) for a, b in pairwise(marks)]
            # fmt: off
            if bumps > 0:
                checks.append(("checkpoints rarely", bumps <= -(-todo // every) + 1,
                    f"progress is checkpointed at most once per {every} units (checkpoints are costly)",
                    f"{owner} changed its claim {bumps} times for {todo} units"))
            if issued() > start:
                checks.append(("own transaction", all(n <= 1 for n, _ in steps),
                    "each invoice commits in its own fenced transaction",
                    "one commit carried several invoices"))
            checks.extend(("checkpoint in tx", n >= 1, ("the checkpoint commits in the fenced "
                           "transaction of the unit that completes the batch"),
                           f"{owner} committed a checkpoint with no invoice of its own")
                          for n, moved in steps if moved)
            if "C" in count and count["after"]:
                late = execute(admin, "SELECT unit FROM issued WHERE number > ?", (count["mark"],))
                checks.append(("stale refused", not late, ("a stale worker's step is refused by the "
                               "fence: nothing it writes after the takeover commits"),
                               f"after C (8) took the job over, B (7) issued {[u for u, in late]}"))
            # fmt: on
            return fate["dead"], count.get("C")

        died, taken = run("B", 7, k["dies_after"], k["statement"], k.get("takeover", 0))
        if taken:
            run("C", 8, claim=taken)
        elif died and desk.get(job).state != "done":
            clock.advance(60)
            again = len(desk.sweep(older_than=30)) == 1
            rule = "a crashed worker's unfinished claim stays claimed, for the sweeper to requeue"
            checks.append(("finishes", again, rule, f"the claim after the crash: {desk.get(job)}"))
            if again:
                run("C", 8)
        final = desk.get(job)
        counts = dict(execute(admin, "SELECT unit, COUNT(*) FROM issued GROUP BY unit"))
        twice = {u: n for u, n in counts.items() if n > 1}
        missing = [u for u, _ in units if u not in counts]
        if counts:
            rule = (
                "a retry never repeats an invoice that was already issued (one operation id per "
                "unit)"
            )
            detail = f"units invoiced more than once: {twice}" + " after B died" * died
            checks.append(("no repeat", not twice, rule, detail))
        detail = f"missing: {missing}; the claim: {final}"
        checks.append(("every unit", not missing, "every unit gets its invoice", detail))
        # a unit skipped is every unit's fault
        counted = final.progress == len(units) or bool(missing)
        rule = "the job ends done, with its progress at the number of units"
        checks.append(("finishes", final.state == "done" and counted, rule, f"the claim: {final}"))
    _judge(checks)
