"""Grading checks of exercise 06 (registered in :mod:`labkit.grading`).

* 06.1 the owner-and-generation-checked release: late releases, a restarted owner,
  and B taking over between the release's SQL statements.
* 06.2 jittered exponential backoff: range, spread, growth up to the cap, and
  independence from the global ``random``.
"""

from __future__ import annotations

import math
from random import Random, getstate as global_state, seed as seed_global, setstate as restore_global

from labkit.grading.lab import between_statements, lease_event, scratch
from labkit.clock import VirtualClock
from labkit.db import execute
from labkit.grading import BOOL, NUMBER, Schedule, expect, hostile, task
from labkit.sim.history import Event, check as violations
from labkit.lease import LeaseAuthority


# ---------------------------------------------------------------- 06.1 release


def _job(rng: Random) -> str:
    return rng.choice(["invoice-run", "report", "nightly", "billing"]) + f"-{rng.randrange(100)}"


def _release_knobs(rng: Random) -> dict:
    return {
        "story": rng.choice(["own", "successor", "same_owner_again", "race", "race", "two_names"]),
        "before": rng.randrange(0, 5),
        "inject_at": rng.randrange(1, 5),
    }


RELEASE_HOSTILE = hostile(
    "story before inject_at",
    ("A releases its own live lease", "own", 0, 0),
    ("A's late release arrives after B took over", "successor", 6, 0),
    ("A restarted and re-acquired; the old A's late release arrives", "same_owner_again", 2, 0),
    ("someone else presents the holder's generation", "foreign", 3, 0),
    ("A holds two leases with the same generation", "two_names", 0, 0),
    ("nothing is held", "nothing", 1, 0),
    ("B takes over just before the release's 1st statement", "race", 1, 1),
    ("B takes over just before the release's 2nd statement", "race", 4, 2),
    ("B takes over just before the release's 3rd statement", "race", 0, 3),
)


def _leases(db) -> list[tuple]:
    return execute(db, "SELECT name, owner, generation FROM leases ORDER BY name")


@task(
    "06.1",
    "the owner-and-generation-checked release",
    RELEASE_HOSTILE,
    count=16,
    make=_release_knobs,
    returns=BOOL,
)
def release_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 06.1: ``answer(db, name, owner, generation) -> bool``."""
    rng, k, story = schedule.rng, schedule.knobs, schedule.knobs["story"]
    job, a, b = _job(rng), "A", "B"
    ttl = rng.choice([5, 10, 30])
    with scratch() as tmp:
        db, other = tmp.open(), tmp.open()
        clock = VirtualClock(rng.randrange(0, 1000))
        authority = LeaseAuthority(other, clock)
        for _ in range(k["before"]):  # earlier holders: generations the answer cannot guess
            authority.release(authority.acquire(job, "earlier", ttl))
        mine = authority.acquire(job, a, ttl)
        lease_event(history, clock.now(), mine)
        caller, mine_row = a, (job, a, mine.generation)
        seen = {"present": None}

        def take_over(who: str) -> bool:
            seen["present"] = mine_row in _leases(other)
            clock.advance(ttl + 1)
            lease_event(history, clock.now(), authority.acquire(job, who, ttl))
            seen["counters"] = execute(other, "SELECT * FROM lease_counter ORDER BY name")
            return True

        if story in ("successor", "same_owner_again"):
            take_over(b if story == "successor" else a)
        elif story == "foreign":
            caller = b
        elif story == "two_names":
            for _ in range(k["before"]):
                authority.release(authority.acquire(job + "-archive", "earlier", ttl))
            extra = authority.acquire(job + "-archive", a, ttl)
            history.append(
                Event(clock.now(), a, "acquire", "ok", extra.generation, target=extra.name)
            )
        elif story == "nothing":
            authority.release(mine)
        seen["counters"] = execute(db, "SELECT * FROM lease_counter ORDER BY name")
        before = _leases(db)
        with between_statements(
            db, k["inject_at"] if story == "race" else 0, lambda: take_over(b)
        ) as race:
            got = answer(db, job, caller, mine.generation)
        outcome = "ok" if got else "lost"
        history.append(Event(clock.now(), caller, "release", outcome, mine.generation, target=job))
        expect(
            got in (True, False) and not isinstance(got, str),
            "the release answers True or False (did it delete the lease?)",
            f"it returned {got!r}",
        )
        expect(
            execute(db, "SELECT * FROM lease_counter ORDER BY name") == seen["counters"],
            "a release never touches the permanent generation counter",
            "lease_counter changed",
        )
        after = _leases(db)
        if story == "race" and race["done"]:  # B took over mid-release
            should = not seen["present"]  # True only if A's row was gone before B came
            expected = sorted([r for r in before if r[0] != job] + [(job, b, mine.generation + 1)])
        else:
            should = story in ("own", "two_names", "race")
            expected = [r for r in before if r != mine_row] if should else before
        what = _story(story if story != "race" or race["done"] else "own", a, b)
        expect(
            bool(got) == should, f"the release answers {should} when {what}", f"it returned {got!r}"
        )
        expect(
            after == expected,
            "the release deletes the caller's lease only, and only while owner "
            f"and generation both match ({what})",
            f"lease rows before {before}, after {after}",
        )
        if story == "race" and not race["done"]:
            take_over(b)  # B arrives after an undisturbed release
        found = [v for v in violations(history) if v.kind == "foreign_release"]
        expect(
            not found,
            "a late release never deletes another holder's lease",
            found[0].message if found else "",
        )


def _story(story: str, a: str, b: str) -> str:
    return {
        "own": f"{a} releases its own live lease",
        "successor": f"{a}'s lease expired and {b} holds the next generation",
        "same_owner_again": f"{a} re-acquired with a newer generation after its old lease expired",
        "foreign": f"{b} presents {a}'s generation",
        "two_names": f"{a} also holds another lease with the same generation",
        "nothing": "nothing is held",
        "race": f"{b} took over between the release's statements",
    }[story]


# ---------------------------------------------------------------- 06.2 backoff


def _backoff_knobs(rng: Random) -> dict:
    return {
        "base": rng.choice([0.01, 0.05, 0.1, 0.25, 1.0]) * rng.randint(1, 4),
        "cap": rng.choice([1.0, 5.0, 30.0, 60.0]),
        "attempts": rng.randint(8, 40),
    }


BACKOFF_HOSTILE = hostile(
    "base cap attempts",
    ("base 0.1 s, cap 10 s", 0.1, 10.0, 30),
    ("base 1 s, cap 2 s (the cap bites at once)", 1.0, 2.0, 12),
    ("tiny base 0.003 s, cap 60 s, many attempts", 0.003, 60.0, 60),
)

SAMPLES, AGAIN = 30, 8  # rng seeds per attempt; how many of them are drawn a second time


def _attempts(base: float, cap: float, count: int) -> list[int]:
    """The attempts worth checking: the growth phase, a few capped ones, and two large ones."""
    grow = next(a for a in range(2000) if base * 2**a >= cap)
    return list(range(min(count, grow + 3))) + [count + 20, 100]


@task(
    "06.2",
    "jittered exponential backoff",
    BACKOFF_HOSTILE,
    count=6,
    make=_backoff_knobs,
    returns=NUMBER,
)
def backoff_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 06.2: ``answer(attempt, *, base, cap, rng) -> seconds``."""
    k = schedule.knobs
    base, cap, attempts = k["base"], k["cap"], k["attempts"]
    seeds = [schedule.seed * 7919 + i for i in range(SAMPLES)]
    saved = global_state()
    try:
        for attempt in _attempts(base, cap, attempts):
            ceiling = min(cap, base * 2**attempt)
            seed_global(attempt * 31 + 1)
            first = [answer(attempt, base=base, cap=cap, rng=Random(s)) for s in seeds]
            seed_global(attempt * 31 + 2)
            again = [answer(attempt, base=base, cap=cap, rng=Random(s)) for s in seeds[:AGAIN]]
            if attempt < 6:  # for the replay: one contender's waits
                t = history[-1].until if history else 0.0
                history.append(Event(t, "A", "acquire", "held", target="lease"))
                history.append(Event(t, "A", "wait", "ok", until=t + first[0]))
            expect(
                all(
                    isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d)
                    for d in first
                ),
                "a delay is a finite number of seconds",
                f"attempt {attempt}: {first[:3]}",
            )
            expect(
                first[:AGAIN] == again,
                "the delay depends only on the arguments and the rng passed in "
                "(the same seed gives the same delay, whatever the global random does)",
                f"attempt {attempt}: two runs with equal seeds gave {first[0]!r} and {again[0]!r}",
            )
            low, high = min(first), max(first)
            expect(
                low >= 0 and high <= ceiling * (1 + 1e-9),
                f"every delay lies in [0, min(cap, base * 2**attempt)] = [0, {ceiling:g}] at attempt {attempt}",
                f"saw delays from {low:g} to {high:g}",
            )
            expect(
                high - low >= 0.3 * ceiling,
                f"delays are jittered: different rngs spread them over the range at attempt {attempt}",
                f"{SAMPLES} rngs gave delays from {low:g} to {high:g} only",
            )
            expect(
                high >= 0.8 * ceiling,
                f"the delays reach up towards min(cap, base * 2**attempt) = {ceiling:g} at attempt {attempt} "
                "(exponential growth, up to the cap)",
                f"the largest of {SAMPLES} delays was {high:g}",
            )
    finally:
        restore_global(saved)
