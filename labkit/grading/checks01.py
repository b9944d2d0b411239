"""Grading checks of exercise 01 (registered in :mod:`labkit.grading`).

* 01.1 finding the lost updates in a recorded history (the lost writes are known
  by construction).
* 01.2 predicting the overwrite: compared with a real unprotected run of
  :func:`labkit.scenarios.expired_but_alive`, boundaries included.
"""

from __future__ import annotations

from random import Random

from labkit.grading import BOOL, Schedule, expect, hostile, task
from labkit.sim.history import Event


# ---------------------------------------------------------------- 01.1: lost updates in a history


def _story(rng: Random, story: str) -> tuple[list, list]:
    """A recorded history and, known by construction, the writes whose work was lost."""
    events, lost, last, clock = [], [], {}, [rng.choice([0.0, 100.0, 3600.0])]

    def ev(worker, action, outcome="ok", gen=None, target=None, until=None):
        clock[0] += rng.choice([0.25, 0.5, 1.0, 1.5, 2.0, 5.0])
        events.append(Event(clock[0], worker, action, outcome, gen, target=target, until=until))
        if action == "write" and outcome == "ok":
            before = last.get(target)
            if before is not None and gen < before.generation:
                lost.append(before)
            last[target] = events[-1]

    def run(worker, gen, writes, outcome="ok"):
        ev(worker, "acquire", "ok", gen, "invoice-run", clock[0] + 10)
        for target in writes:
            ev(worker, "write", outcome, gen, target)
        ev(worker, "release", "ok", gen, "invoice-run")

    if story in ("lesson", "fenced"):
        ev("A", "acquire", "ok", 7, "invoice-run", clock[0] + 10)
        ev("A", "pause", until=clock[0] + 30)
        run("B", 8, ["INV-1", "INV-2"])
        ev("A", "resume")
        ev("A", "write", "ok" if story == "lesson" else "rejected", 7, "INV-1")
    elif story == "several":
        run("B", 8, ["INV-1", "INV-2", "INV-3"])
        ev("A", "write", "ok", 7, "INV-1")  # B's INV-1 is lost
        ev("A", "write", "ok", 7, "INV-1")  # A over A: nothing new lost
        run("C", 9, ["INV-1", "INV-2"])
        ev("A", "write", "rejected", 7, "INV-2")
        ev("B", "write", "ok", 8, "INV-2")  # C's INV-2 is lost
        ev("A", "write", "ok", 7, "INV-3")  # B's INV-3 is lost
        ev("A", "write", "ok", 7, "INV-4")  # nobody else wrote INV-4: nothing lost
    elif story == "clean":
        run("A", 7, ["INV-1", "INV-2"])
        run("B", 8, ["INV-1", "INV-1", "INV-3"])  # newer over older, equal over equal: fine
        ev("A", "write", "rejected", 7, "INV-1")
        ev("A", "write", "crashed", 7, "INV-3")
    else:
        names = rng.sample("ABCDEFGH", rng.randint(2, 5))
        gens = dict(zip(names, sorted(rng.sample(range(1, 60), len(names)))))
        targets = [f"INV-{i}" for i in rng.sample(range(1, 30), rng.randint(1, 4))]
        for _ in range(rng.randint(4, 30)):
            w = rng.choice(names)
            if rng.random() < 0.2:
                action = rng.choice(["acquire", "pause", "resume", "wait", "release"])
                ev(w, action, "ok", gens[w], "invoice-run")
            else:
                outcome = rng.choice(["ok"] * 6 + ["rejected", "crashed"])
                ev(w, "write", outcome, gens[w], rng.choice(targets))
    return events, lost


LOST_HOSTILE = hostile(
    "story",
    ("the lesson's story: A's 7 lands on B's 8", "lesson"),
    ("the same story behind a fence: A's write is rejected", "fenced"),
    ("three workers, three lost writes, and writes that look alike", "several"),
    ("a clean history with rejected and crashed writes", "clean"),
)


@task("01.1", "finding the lost updates", LOST_HOSTILE, count=40, returns=(list, tuple))
def lost_updates_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 01.1: ``answer(history) -> the committed writes whose work was lost``."""
    events, lost = _story(schedule.rng, schedule.knobs["story"])
    history.extend(events)
    got = answer(list(events))
    try:
        got = list(got)
    except TypeError:
        expect(False, "find_lost_updates returns a list of events", f"it returned {got!r}")
    foreign = [e for e in got if e not in events]
    expect(
        not foreign,
        "every event returned comes from the history",
        f"{foreign[0]!r} is not in it" if foreign else "",
    )
    want = [i for i, e in enumerate(events) if e in lost]
    have = sorted({events.index(e) for e in got})

    def show(ids) -> str:
        picked = [events[i] for i in ids]
        told = [f"{e.worker}'s {e.target} (gen {e.generation}, t={e.time:g})" for e in picked]
        return ", ".join(told) or "none"

    expect(
        have == want,
        "the lost writes are exactly the committed writes whose next committed write to the "
        "same invoice carries a lower generation",
        f"expected {show(want)}; got {show(have)}",
    )


# ---------------------------------------------------------------- 01.2: predicting the overwrite


def _overwrite_knobs(rng: Random) -> dict:
    ttl = rng.choice([0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.25, 60.0, 90.0])
    offset = rng.choice(
        [-7.0, -1.0, -0.25, 0.0, 0.5, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 4.0, 20.0, 45.0]
    )
    return {"pause": max(0.0, ttl + offset), "ttl": ttl}


OVERWRITE_HOSTILE = hostile(
    "pause ttl",
    ("the lesson's numbers: pause 30 s, lease 10 s", 30.0, 10.0),
    ("a one-minute lease, same pause", 30.0, 60.0),
    ("a one-minute lease, a longer pause", 90.0, 60.0),
    ("A wakes up exactly when its lease expires", 10.0, 10.0),
    ("A wakes up just after B acquired, before B writes", 11.0, 10.0),
    ("A wakes up at the very instant B writes INV-1", 11.5, 10.0),
    ("A wakes up a quarter second after B wrote INV-1", 11.75, 10.0),
    ("a tiny lease and a short pause", 2.5, 0.5),
    ("no pause at all", 0.0, 10.0),
)


@task(
    "01.2",
    "predicting the overwrite",
    OVERWRITE_HOSTILE,
    count=24,
    make=_overwrite_knobs,
    returns=BOOL,
)
def overwrite_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 01.2: ``answer(pause, ttl) -> bool``, compared with a real unprotected run."""
    from labkit.scenarios import expired_but_alive

    pause, ttl = schedule.knobs["pause"], schedule.knobs["ttl"]
    run = expired_but_alive(protected=False, pause=pause, ttl=ttl)
    history.extend(run.history)
    gens = {
        e.worker: e.generation for e in run.history if e.action == "acquire" and e.outcome == "ok"
    }
    final = {r["invoice_id"]: r["generation"] for r in run.tables["invoices"]}
    truth = final["INV-1"] == gens["A"]
    got = answer(pause, ttl)
    expect(
        isinstance(got, (bool, int)) and got in (0, 1),
        "predict_overwrite returns True or False",
        f"it returned {got!r}",
    )
    expect(
        bool(got) == truth,
        f"the prediction matches the real run: with pause={pause:g} s and ttl={ttl:g} s, "
        f"A {'does' if truth else 'does not'} overwrite B's INV-1",
        f"predict_overwrite({pause:g}, {ttl:g}) returned {got!r}; in the run, INV-1 ended with generation "
        f"{final['INV-1']}",
    )
