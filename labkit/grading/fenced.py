"""The stories the fenced writers of 02.1 (one invoice a call) and 03.1 (a batch) are told.

:func:`fenced_trial` tells one schedule of :data:`FENCED_HOSTILE` (or a random one) to the
writers of :mod:`labkit.grading.writers`, which log and judge each call.
"""

from __future__ import annotations

from random import Random

from labkit.grading import Schedule, hostile
from labkit.grading.writers import JOB, OTHER, Writers, generation_of, lab


def _invoices(rng: Random, fresh: list, batch: bool, known: list) -> dict:
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


def fenced_trial(answer, schedule: Schedule, history: list, batch: bool) -> None:
    """Run a fenced writer through one schedule of :data:`FENCED_HOSTILE` (or a random one).

    The answer is ``answer(conn, job, invoice_id, amount, generation)`` (02.1) or, with
    ``batch``, ``answer(conn, job, generation, invoices)`` (03.1). Raises Broken.
    """
    rng, story = schedule.rng, schedule.knobs["story"]
    with lab(rng, story) as (db, conns, start):
        w, fresh, known = Writers(answer, batch, db, conns, history), [0], []

        def inv():
            return _invoices(rng, fresh, batch, known)

        if story == "lesson":  # the lesson's numbers, and both halves of the lesson
            w.write("A", JOB, 7, inv())
            w.write("B", JOB, 8, {"INV-1": 200, **(inv() if batch else {})})
            w.write("B", JOB, 8, inv())
            w.write("A", JOB, 7, inv())
            w.write("A", JOB, 7, {"INV-1": 100})
        elif story == "race":
            w.race(JOB, schedule.knobs["at"], 7, 8, inv(), inv())
            w.write("A", JOB, 7, inv())
        elif story == "crash":
            # first a stale one, refused before it writes: it never meets the full disk
            batch_ = inv()
            w.write("A", JOB, 6, batch_, crash=rng.choice(list(batch_)))
            batch_ = inv()
            while batch and len(batch_) < 2:  # the full disk comes after the first invoice
                batch_ = inv()
            batch_ = w.write("B", JOB, 8, batch_, crash=list(batch_)[-1])
            w.write("B", JOB, 8, batch_)  # the same write again, once the disk has room
            w.write("B", JOB, 9, inv())  # and a newer one: a crash must not spoil later writes
        elif story == "two jobs":
            w.write("B", OTHER, start[OTHER], inv())
            w.write("A", JOB, 9, inv())
            w.write("B", OTHER, start[OTHER] - 1, inv())
            w.write("A", JOB, 8, inv())
        elif story == "elsewhere":  # OTHER's fence is above JOB's: one below it, equal, or above
            w.write("A", OTHER, start[OTHER] + schedule.knobs["at"], inv())
        else:
            for _ in range(rng.randint(5, 9)):
                job = JOB if rng.random() < 0.8 else OTHER
                cur = generation_of(db, job)
                roll = rng.random()
                if roll < 0.2 and job == JOB:
                    a_gen = cur + rng.randint(0, 1)
                    w.race(job, rng.randint(1, 7), a_gen, a_gen + rng.randint(1, 3), inv(), inv())
                else:
                    gen = max(0, cur + rng.choice([-3, -1, -1, 0, 0, 1, 2]))
                    batch_, who = inv(), rng.choice("AB")
                    crash = rng.choice(list(batch_)) if roll > 0.85 else None
                    w.write(who, job, gen, batch_, crash=crash)
        last = max(0, generation_of(db, JOB) - 1)
        w.write("A", JOB, last, inv())  # the obsolete predecessor, once more at the end


FENCED_HOSTILE = hostile(
    "story at each",
    ("the lesson's story: A writes with 7, B commits 8 (twice), A's 7 comes back", "lesson"),
    ("B arrives before A's first statement", "race", 1),
    ("A checks the fence, then stops before its 2nd statement; B commits 8", "race", 2),
    ("A stops inside its transaction (before statement 3); B arrives", "race", 3),
    ("A stops before its 4th statement; B arrives", "race", 4),
    ("A stops before its 5th statement, and each later one it reaches; B arrives", "race", 5, "at"),
    ("a stale write, disk full; a crash mid-write, the same write again, a newer one", "crash"),
    ("two jobs, each with its own fence", "two jobs"),
    ("a write stale for its own job, though above the other job's fence", "elsewhere", -1),
    ("a write equal to its own job's fence raises no other job's, below it", "elsewhere", 0),
    ("a newer write raises its own job's fence, not the other's below it", "elsewhere", 1),
)
