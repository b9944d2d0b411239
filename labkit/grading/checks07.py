"""Grading checks of exercise 07 (registered in :mod:`labkit.grading`).

* 07.1 the careful sweeper: old unfinished claims are requeued, while their
  owner checkpoints, finishes or loses the claim between the sweeper's statements.
* 07.2 resuming with operation ids: the worker dies at a chosen statement
  (:func:`~labkit.grading.lab.process`) and a successor resumes; no invoice may
  be issued twice.
"""

from __future__ import annotations

from random import Random

from labkit.grading.lab import between_statements, process, scratch
from labkit.clock import VirtualClock
from labkit.db import execute
from labkit.grading import Schedule, expect, hostile, task
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


def _claim_rows(db) -> dict:
    return {
        r[0]: r[1:]
        for r in execute(db, "SELECT job, owner, state, progress FROM claims ORDER BY job")
    }


@task(
    "07.1", "the careful sweeper", SWEEP_HOSTILE, count=16, make=_sweep_knobs, returns=(list, tuple)
)
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
        after = _claim_rows(db)
        expected = dict(before)
        for job in stale:
            if job == moved and race["done"]:
                expected[job] = seen["after"]
            else:
                expected[job] = (
                    after[job][0] if after[job][1] == "queued" else before[job][0],
                    "queued",
                    before[job][2],
                )
        requeued = sorted(j for j in stale if not (j == moved and race["done"]))
        for job in requeued:
            outcome = "ok" if after[job][1] == "queued" else "rejected"
            history.append(Event(now, "sweeper", "write", outcome, target=f"{job} requeued"))
        what = {
            "stale": f"unfinished and untouched for more than {older:g} s",
            "fresh": "recently updated by its owner",
            "done": "finished",
            "queued": "already queued",
        }
        for job, kind in zip(jobs, kinds):
            if job == moved and race["done"]:
                story = (
                    f"it was old, but its owner {'moved it on' if k['mover'] != 'taken' else 'changed'} "
                    f"({k['mover']}) while the sweeper ran"
                )
                expect(
                    after[job] == expected[job],
                    "the sweeper never requeues a claim that moved on after it was read",
                    f"{job}: {story}; now {after[job]}",
                )
            elif kind == "stale":
                expect(
                    after[job][1:] == ("queued", before[job][2]),
                    "the sweeper requeues every old unfinished claim, keeping its progress",
                    f"{job} ({what[kind]}): before {before[job]}, after {after[job]}",
                )
            else:
                expect(
                    after[job] == before[job],
                    f"the sweeper leaves a claim that is {what[kind]} alone",
                    f"{job}: before {before[job]}, after {after[job]}",
                )
        expect(
            isinstance(got, (list, tuple, set)) and sorted(got) == requeued,
            "the sweeper returns the jobs it requeued",
            f"it returned {got!r}, requeued {requeued}",
        )
        if moved and not race["done"]:
            move_after = claims.get(moved)
            expect(
                move_after.state == "queued",
                "the sweeper requeues every old unfinished claim",
                f"{moved}: {move_after}",
            )


# ---------------------------------------------------------------- 07.2 resume with operation ids


def _resume_knobs(rng: Random) -> dict:
    return {
        "units": rng.randint(3, 9),
        "every": rng.choice([2, 3, 4]),
        "dies_after": rng.choice([0, rng.randint(1, 8)]),
        "statement": rng.randint(1, 40),
    }


RESUME_HOSTILE = hostile(
    "units every dies_after statement",
    ("B dies just after its 4th invoice commits, before the checkpoint catches up", 6, 3, 4, 0),
    ("B dies just after its 2nd invoice commits", 5, 4, 2, 0),
    ("B dies at its 3rd SQL statement", 4, 2, 0, 3),
    ("nobody dies", 7, 3, 0, 0),
)


@task("07.2", "resuming with operation ids", RESUME_HOSTILE, count=16, make=_resume_knobs)
def resume_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 07.2: ``answer(claims, claim, units, issue_invoice, *, every)``."""
    from labkit.mechanisms.recovery import Claims

    rng, k = schedule.rng, schedule.knobs
    job = f"invoice-run-{rng.randrange(1000)}"
    units = [(f"c{i + 1}", rng.randrange(50, 500)) for i in range(k["units"])]
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

        def run(owner: str, generation: int, dies_after: int, statement: int) -> bool:
            conn = tmp.open()
            claim = Claims(conn, clock).claim(job, owner, generation)
            history.append(Event(clock.now(), owner, "acquire", "ok", generation, target=job))
            start, count = issued(), {"sql": 0, "batches": []}

            def dies(sql: str) -> bool:
                count["sql"] += 1
                if sql.lstrip().upper().startswith("COMMIT"):
                    count["batches"].append(issued())
                return (statement and count["sql"] >= statement) or (
                    dies_after
                    and sql.lstrip().upper().startswith(("COMMIT", "BEGIN"))
                    and issued() - start >= dies_after
                )

            try:
                with process(conn, dies) as fate:
                    try:
                        answer(
                            Claims(conn, clock), claim, list(units), issue_invoice, every=k["every"]
                        )
                    except Exception:
                        if not fate["dead"]:
                            raise
            finally:
                conn.conn.close()
            for number, unit in execute(
                admin, "SELECT number, unit FROM issued WHERE number > ?", (start,)
            ):
                key, what = f"{job}/{unit}", f"INV-{number} ({unit})"
                event = Event(clock.now(), owner, "write", "ok", generation, key=key, target=what)
                history.append(event)
            if fate["dead"]:
                history.append(Event(clock.now(), owner, "crash", "ok"))
            after = desk.get(job)
            bumps = after.version - claim.version - (after.state == "done")
            todo = len(units) - claim.progress
            expect(
                bumps <= -(-todo // k["every"]) + 1,
                f"progress is checkpointed at most once per {k['every']} units (checkpoints are costly)",
                f"{owner} changed its claim {bumps} times for {todo} units",
            )
            marks = count["batches"] + [issued()]
            expect(
                all(b - a <= 1 for a, b in zip(marks, marks[1:])),
                "each invoice commits in its own fenced transaction",
                "one commit carried several invoices",
            )
            return fate["dead"]

        died = run("B", 7, k["dies_after"], k["statement"])
        if died and desk.get(job).state != "done":
            clock.advance(60)
            expect(
                len(desk.sweep(older_than=30)) == 1,
                "a crashed worker's unfinished claim stays claimed, for the sweeper to requeue",
                f"the claim after the crash: {desk.get(job)}",
            )
            run("C", 8, 0, 0)
        final = desk.get(job)
        counts = dict(execute(admin, "SELECT unit, COUNT(*) FROM issued GROUP BY unit"))
        twice = {u: n for u, n in counts.items() if n > 1}
        expect(
            not twice,
            "a retry never repeats an invoice that was already issued (one operation id per unit)",
            f"units invoiced more than once: {twice}"
            + (" after B died and C resumed" if died else ""),
        )
        missing = [u for u, _ in units if u not in counts]
        expect(
            not missing, "every unit gets its invoice", f"missing: {missing}; the claim: {final}"
        )
        expect(
            final.state == "done" and final.progress == len(units),
            "the job ends done, with its progress at the number of units",
            f"the claim: {final}",
        )
