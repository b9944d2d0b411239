"""Grading checks of exercise 06 (registered in :mod:`labkit.grading`).

* 06.1 the owner-and-generation-checked release: late releases, a restarted owner,
  and B taking over between the release's SQL statements.
* 06.2 jittered exponential backoff: range, full jitter, growth up to the cap, and
  independence from the global ``random``.
* 06.3, the version-wait protocol, is checked in :mod:`labkit.grading.checks06b`.

Each trial judges all its properties of a call together (:func:`_in_turn`), so that one
property broken everywhere does not hide the others.
"""

from __future__ import annotations

import math
from random import Random, getstate as global_state, seed as seed_global, setstate as restore_global

from labkit.grading.lab import Fresh, between_statements, lease_event, scratch
from labkit.clock import VirtualClock
from labkit.db import execute
from labkit.grading import BOOL, NUMBER, Schedule, expect_all, hostile, task
from labkit.sim.history import Event, check as violations
from labkit.lease import LeaseAuthority


# ---------------------------------------------------------------- 06.1 release


def _job(rng: Random) -> str:
    return rng.choice(["invoice-run", "report", "nightly", "billing"]) + f"-{rng.randrange(100)}"


def _release_knobs(rng: Random) -> dict:
    return {
        "story": rng.choice(
            ["own", "successor", "same_owner_again", "race", "race", "two_names", "foreign"]
        ),
        "before": rng.randrange(0, 5),
        "inject_at": rng.randrange(1, 5),
    }


RELEASE_HOSTILE = hostile(
    "story before inject_at each",
    ("A releases its own live lease", "own", 0, 0),
    ("A's late release arrives after B took over", "successor", 6, 0),
    ("A restarted and re-acquired; the old A's late release arrives", "same_owner_again", 2, 0),
    ("someone else presents the holder's generation", "foreign", 3, 0),
    ("A holds two leases with the same generation", "two_names", 0, 0),
    ("nothing is held", "nothing", 1, 0),
    ("B takes over just before the release's 1st statement", "race", 1, 1),
    ("B takes over just before the release's 2nd statement", "race", 4, 2),
    (
        "B takes over just before the release's 3rd statement, and each later one",
        "race",
        0,
        3,
        "inject_at",
    ),
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
    properties={
        "answers": "the release answers True when it deleted the caller's lease, else False",
        "own only": "the release deletes a lease only while the caller holds it at that generation",
        "race": "a successor who takes over between the release's statements keeps its lease",
        "counter": "a release never touches the permanent generation counter",
    },
)
def release_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 06.1: ``answer(db, name, owner, generation) -> bool``."""
    rng, k = schedule.rng, schedule.knobs
    story = k["story"]
    job = _job(rng)
    a, b = "A", "B"
    ttl = rng.choice([5, 10, 30])
    with scratch() as tmp:
        db, other = tmp.open(), tmp.open()
        clock = VirtualClock(rng.randrange(0, 1000))
        authority = LeaseAuthority(other, clock)
        for _ in range(k["before"]):  # earlier holders: generations the answer cannot guess
            authority.release(authority.acquire(job, "earlier", ttl))
        mine = authority.acquire(job, a, ttl)
        lease_event(history, clock.now(), mine)
        caller = a
        mine_row = (job, a, mine.generation)
        seen = {"present": None}

        def take_over(who: str) -> bool:
            seen["present"] = mine_row in _leases(other)
            seen["at"] = (len(history), clock.now())
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
        at, when = len(history), clock.now()  # where the release goes on the timeline: before
        if race["done"] and not seen["present"]:  # B's acquire if its DELETE ran before B came
            at, when = seen["at"]
        outcome = "ok" if got else "lost"
        history.insert(at, Event(when, caller, "release", outcome, mine.generation, target=job))
        counted = "SELECT * FROM lease_counter ORDER BY name"
        kept = execute(db, counted) == seen["counters"]
        after = _leases(db)
        racing = race["done"]
        b_row = (job, b, mine.generation + 1)
        if racing:  # B took over mid-release
            should = not seen["present"]  # True only if A's row was gone before B came
            expected = sorted([r for r in before if r[0] != job] + [b_row])
        else:
            should = story in ("own", "two_names", "race")
            expected = [r for r in before if r != mine_row] if should else before
        # it did the task: it deleted A's row before B came, or changed what B alone would leave
        did = not kept or after != (expected if racing else before) or racing and should
        if story == "race" and not racing:
            take_over(b)  # B arrives after an undisturbed release
        what = _story(story if story != "race" or racing else "own", a, b)
        found = [v for v in violations(history) if v.kind == "foreign_release"]
        if story == "race" and not did:  # a release that rightly did nothing in the race keeps
            rows = _leases(db)  # its rules only if it does release a lease: B releases its own
            freed = answer(db, job, b, b_row[2])
            outcome = "ok" if freed else "lost"
            history.append(Event(clock.now(), b, "release", outcome, b_row[2], target=job))
            did = freed is True and b_row in rows and _leases(db) == [r for r in rows if r != b_row]
            kept = kept and execute(db, counted) == seen["counters"]

        own = "race" if racing else "own only"  # whose rows these are: the race's, or A's own
        rule = "the release deletes the caller's lease only, and only while owner and generation"
        said = f"it returned {got!r}"
        binary = "the release answers True or False (did it delete the lease?)"
        answers = f"the release answers {should} when {what}"
        rows = f"lease rows before {before}, after {after}"
        foreign = found[0].message if found else ""
        untouched = "a release never touches the permanent generation counter"
        _in_turn(
            [
                ("answers", got in (True, False) and not isinstance(got, str), binary, said),
                ("race" if racing else "answers", bool(got) == should, answers, said),
            ],
            [
                (own, after == expected, f"{rule} both match ({what})", rows),
                (own, not found, "a late release never deletes another holder's lease", foreign),
            ],
            [("counter", kept, untouched, "lease_counter changed")],
            acted=did,  # a release that did nothing keeps every rule, trivially
        )


def _in_turn(*groups: list, acted: bool = True) -> None:
    """Judge every ``(property, holds, rule, detail[, acted])`` of the groups together (see
    ``expect_all``): one that held is evidence only where the answer ``acted``."""
    checks = [(*check, acted)[:5] for group in groups for check in group]
    judged = [(ok, rule, detail, prop) for prop, ok, rule, detail, did in checks if did or not ok]
    expect_all(judged)


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
    properties={
        "range": "every delay lies between zero and the ceiling, min(cap, base * 2**attempt)",
        "growth": "the delays reach up to the ceiling, which doubles each attempt up to the cap",
        "full jitter": "the delay is drawn uniformly from zero up to the ceiling (full jitter)",
        "rng": "the delay depends only on its arguments and the rng passed in",
    },
)
def backoff_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 06.2: ``answer(attempt, *, base, cap, rng) -> seconds``."""
    k, runs, scales = schedule.knobs, [], {}  # (attempt, ceiling, delays, the first AGAIN again)
    base, cap, attempts = k["base"], k["cap"], k["attempts"]
    rng = schedule.rng  # the run's draws: no table of the rngs passed in fits in an answer
    seeds = [rng.getrandbits(32) for _ in range(SAMPLES)]
    saved = global_state()
    try:
        for attempt in _attempts(base, cap, attempts):
            seed_global(attempt * 31 + 1)
            first = [answer(attempt, base=base, cap=cap, rng=Fresh(s)) for s in seeds]
            seed_global(attempt * 31 + 2)
            again = [answer(attempt, base=base, cap=cap, rng=Fresh(s)) for s in seeds[:AGAIN]]
            runs.append((attempt, min(cap, base * 2**attempt), first, again))
            seed_global(attempt * 31 + 1)  # twice the base and the cap: a backoff's delays double
            twice = [
                answer(attempt, base=2 * base, cap=2 * cap, rng=Fresh(s)) for s in seeds[:AGAIN]
            ]
            scales[attempt] = all(
                _number(d) and math.isclose(d, 2 * f, rel_tol=1e-9, abs_tol=1e-12)
                for d, f in zip(twice, first)
            )
    finally:
        restore_global(saved)
    for attempt, _, first, _ in runs[:6]:  # for the replay: one contender's waits (finite ones:
        t = history[-1].until if history else 0.0  # a delay out of all bounds is drawn as 100 cap)
        wait = first[0] if _number(first[0]) and abs(first[0]) <= 100 * cap else 100 * cap
        history.append(Event(t, "A", "acquire", "held", target="lease"))
        history.append(Event(t, "A", "wait", "ok", until=t + wait))

    grow = "the delays reach up towards min(cap, base * 2**attempt)"
    fit = "delays are jittered over the whole range (full jitter): different rngs spread them "
    same = "the delay depends only on the arguments and the rng passed in (the same seed gives "
    same += "the same delay, whatever the global random does)"
    # a constant, or delays far below the ceiling, keep range and rng trivially: those hold only
    # where the delays vary and reach a quarter of the ceiling, rng only where they also double
    # with the base and the cap (the attempt passed back does not); growth where they vary, in range
    # (give or take jitter on top); before the cap they start small: not past twice the ceiling
    varies = len({d for run in runs for d in run[2] if _number(d)}) > 1
    real = {n: varies and max(first) >= c / 4 for n, c, first, _ in runs}
    _in_turn(
        [
            (
                "range",
                all(_number(d) and 0 <= d <= c * (1 + 1e-9) for d in first),
                f"every delay lies in [0, min(cap, base * 2**attempt)] = [0, {c:g}] at attempt {n}",
                f"saw delays from {min(first):g} to {max(first):g}",
                real[n],
            )
            for n, c, first, _ in runs
        ],
        [
            (
                "growth",
                0.65 * c <= max(first) and (max(first) <= 2 * c or c == cap),
                f"{grow} = {c:g} at attempt {n} (exponential growth, up to the cap"
                + (")" if c == cap else f"; still below the cap, not past {2 * c:g})"),
                f"the largest of {SAMPLES} delays was {max(first):g}",
                varies and max(first) <= 2 * c,
            )
            for n, c, first, _ in runs
        ],
        [  # its shape where it reaches 0.8 of the ceiling (its height is growth's, a delay above
            # the ceiling range's; lower, a sample of a shorter range is too often all below its
            # half; one delay for every rng: from half): about half below half the ceiling
            # (the bounds here and in growth fail a fresh uniform sample about once in 10**4 runs)
            (
                "full jitter",
                3 <= low <= SAMPLES - 3,
                f"{fit}uniformly from zero up, about half below half the ceiling, at attempt {n}",
                f"{low} of {SAMPLES} delays lie below {top / 2:g}, half of {top:g}",
            )
            for n, c, first, _ in runs
            for top in [max(c, max(first))]
            if max(first) >= (top / 2 if len(set(first)) == 1 else 0.8 * top)
            for low in [sum(d < top / 2 for d in first)]
        ],
        [
            (
                "rng",
                first[:AGAIN] == again,
                same,
                f"attempt {n}: two runs with equal seeds gave {first[0]!r} and {again[0]!r}",
                real[n] and scales[n],
            )
            for n, _, first, again in runs
        ],
    )


def _number(d) -> bool:
    return isinstance(d, (int, float)) and math.isfinite(d)
