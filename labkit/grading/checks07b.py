"""Grading check of exercise 07, task 07.2 (registered in :mod:`labkit.grading`).

* 07.2 resuming with operation ids: the worker dies at a chosen statement
  (:func:`~labkit.grading.lab.process`) and a successor resumes; no invoice may
  be issued twice.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from random import Random

from labkit.clock import VirtualClock
from labkit.db import execute
from labkit.grading import Schedule, hostile, task
from labkit.grading.checks07 import _judge
from labkit.grading.lab import process, scratch
from labkit.grading.verdicts import Refused
from labkit.sim.history import Event


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


INVOICE = "INSERT INTO invoices(job_id, invoice_id, amount, generation) VALUES (?, ?, ?, ?)"

RESUME_RULES = {  # what the resuming worker must do, in the words of its findings
    "checkpoints rarely": "progress is checkpointed at most once per {every} units (checkpoints "
    "are costly)",
    "own transaction": "each invoice commits in its own fenced transaction",
    "checkpoint in tx": "the checkpoint commits in the fenced transaction of the unit that "
    "completes the batch",
    "stale refused": "a stale worker's step is refused by the fence: nothing it writes after the "
    "takeover commits",
}


@task(
    "07.2",
    "resuming with operation ids",
    RESUME_HOSTILE,
    count=12,
    make=_resume_knobs,
    properties={
        "own transaction": "each unit's invoice commits in a fenced transaction of its own",
        "stale refused": "a stale worker's step is refused by the fence and writes nothing",
        "checkpoint in tx": "the checkpoint commits in the same transaction as its unit's invoice",
        "checkpoints rarely": "progress is checkpointed at most once per batch of units",
        "no repeat": "a retry never issues a unit's invoice twice",
        "every unit": "every unit of the job gets its invoice",
        "finishes": "the job ends done, with its progress at the number of units",
    },
)
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
        clock = VirtualClock(rng.uniform(0, 100))
        desk = Claims(admin, clock)
        desk.enqueue(job)
        # the judge's record of the invoices it issued, in its memory (no SQL of the answer's
        # reaches it): (number, unit, generation) of those committed, and of those still pending
        # in the running worker's transaction, with admin's data_version before it
        book: dict = {"issued": [], "pending": [], "undone": [], "effect": False}

        def settle() -> None:
            """Once the worker's transaction has ended, its invoices count if it committed (it
            moved admin's data_version); a row of one that it took out again is noted."""
            pending = book["pending"]
            if not pending or book["conn"].conn.in_transaction:
                return
            if execute(admin, "PRAGMA data_version") != book["version"]:
                kept = {i for (i,) in execute(admin, "SELECT invoice_id FROM invoices")}
                book["undone"] += [f"INV-{n}" for n, *_ in pending if f"INV-{n}" not in kept]
                book["issued"] += pending
            book["pending"] = []

        def issue_invoice(tx, unit, amount):
            """The billing effect: every call issues a NEW invoice number."""
            settle()
            if not book["pending"]:
                book["version"] = execute(admin, "PRAGMA data_version")
            number = 1 + max((n for n, *_ in book["issued"] + book["pending"]), default=0)
            book["effect"] = True  # its row counts as the 2 statements the effect was: crashes stay
            tx.execute(INVOICE, (job, f"INV-{number}", amount, tx.token[1]))
            book["pending"].append((number, unit, tx.token[1]))
            return number

        def issued() -> int:
            settle()
            return len(book["issued"])

        def log(owner: str, since: int) -> int:
            """Draw the invoices issued after number ``since``; return the last one's number."""
            for number, unit, g in [row for row in book["issued"] if row[0] > since]:
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
            conn = book["conn"] = tmp.open()
            if claim is None:
                claim = Claims(conn, clock).claim(job, owner, generation)
                history.append(Event(clock.now(), owner, "acquire", "ok", generation, target=job))
            start = issued()
            count = {"sql": 0, "marks": [], "after": 0, "logged": start}

            def dies(sql: str) -> bool:
                settle()
                count["sql"], book["effect"] = count["sql"] + 1 + book["effect"], False
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
                settle()
                conn.conn.close()  # what was open rolls back
                book["pending"] = []
            if book["undone"]:
                raise Refused(f"the answer undid invoices the judge issued: {book['undone']}")
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
            if bumps > 0:
                rarely = bumps <= -(-todo // every) + 1
                rule = RESUME_RULES["checkpoints rarely"].format(every=every)
                detail = f"{owner} changed its claim {bumps} times for {todo} units"
                checks.append(("checkpoints rarely", rarely, rule, detail))
            if issued() > start:
                alone = all(n <= 1 for n, _ in steps)
                detail = "one commit carried several invoices"
                checks.append(("own transaction", alone, RESUME_RULES["own transaction"], detail))
            rule = RESUME_RULES["checkpoint in tx"]
            detail = f"{owner} committed a checkpoint with no invoice of its own"
            checks.extend(("checkpoint in tx", n >= 1, rule, detail) for n, moved in steps if moved)
            if "C" in count and count["after"]:
                late = [u for n, u, _ in book["issued"] if n > count["mark"]]
                detail = f"after C (8) took the job over, B (7) issued {late}"
                checks.append(("stale refused", not late, RESUME_RULES["stale refused"], detail))
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
        counts = dict(sorted(Counter(u for _, u, _ in book["issued"]).items()))
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
