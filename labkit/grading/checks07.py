"""Grading checks of exercise 07 (registered in :mod:`labkit.grading`).

* 07.1 the careful sweeper: old unfinished claims are requeued, while their
  owner checkpoints, finishes or loses the claim between the sweeper's statements.
* 07.2, resuming with operation ids, is checked in :mod:`labkit.grading.checks07b`.
"""

from __future__ import annotations

from random import Random

from labkit.clock import VirtualClock
from labkit.db import execute
from labkit.grading import Schedule, expect_all, hostile, task
from labkit.grading.lab import between_statements, scratch
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


_KINDS = ["stale", "fresh", "done", "queued", "stale"]  # five jobs or more: two old ones
_MIX = ["stale", "stale", "fresh", "done", "queued"]  # the kinds of the claims beyond those
_WHAT = {"fresh": "recently updated by its owner", "done": "finished", "queued": "already queued"}


def _claim_rows(db) -> dict:
    rows = execute(db, "SELECT job, owner, state, progress FROM claims ORDER BY job")
    return {r[0]: r[1:] for r in rows}


def _judge(checks: list) -> None:
    """Judge every ``(prop, held, rule, detail)`` check of one run (see ``expect_all``)."""
    expect_all([(held, rule, detail, prop) for prop, held, rule, detail in checks])


SWEEP_RULES = {  # what the sweeper must do, in the words of its findings
    "unchanged only": "the sweeper never requeues a claim that moved on after it was read",
    "requeues old": "the sweeper requeues every claim unfinished and untouched for more than "
    "{older:g} s",
    "keeps progress": "the sweeper requeues an old claim keeping its progress",
    "owner cleared": "a requeued claim has its owner cleared (owner NULL)",
    "leaves others": "the sweeper leaves a claim that is {what} alone",
    "returns jobs": "the sweeper returns the jobs it requeued",
}


@task(
    "07.1",
    "the careful sweeper",
    SWEEP_HOSTILE,
    count=16,
    make=_sweep_knobs,
    returns=(list, tuple),
    properties={
        "requeues old": "every old unfinished claim is requeued",
        "keeps progress": "a requeued claim keeps its progress",
        "owner cleared": "a requeued claim has its owner cleared",
        "leaves others": "fresh, finished and queued claims are left alone",
        "unchanged only": "a claim that moved on after it was read is never requeued",
        "returns jobs": "the sweeper returns exactly the jobs it requeued",
    },
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
        kinds = _KINDS[: k["jobs"]] if k["jobs"] >= 4 else ["stale"] * 2 + ["done"]
        kinds += [rng.choice(_MIX) for _ in range(k["jobs"] - len(kinds))]
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

        def check(prop: str, held: bool, detail: str, **words) -> None:
            checks.append((prop, held, SWEEP_RULES[prop].format(older=older, **words), detail))

        for job, kind in zip(jobs, kinds):
            seen = f"{job}: before {before[job]}, after {after[job]}"
            if job == raced and acted:
                why = f"it was old, but its claim moved on ({k['mover']}) while the sweeper ran"
                check("unchanged only", after[job] == world[job], f"{why}; {seen}")
            elif kind == "stale" and job != raced:
                check("requeues old", after[job][1] == "queued", seen)
                if after[job][1] == "queued":
                    check("keeps progress", after[job][2] == before[job][2], seen)
                    check("owner cleared", after[job][0] is None, seen)
            elif kind != "stale" and acted:
                check("leaves others", after[job] == before[job], seen, what=_WHAT[kind])
        if mine or got:
            listed = isinstance(got, (list, tuple))
            ok = listed and sorted(map(repr, got)) == sorted(map(repr, mine))
            check("returns jobs", ok, f"it returned {got!r}, requeued {mine}")
        _judge(checks)
