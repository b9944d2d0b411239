"""Grading checks of exercise 01 (registered in :mod:`labkit.grading`).

* 01.1 finding the lost updates in a recorded history; a wrong set is blamed on the
  property whose typical mistake (another finder) explains it best.
* 01.2 predicting the overwrite: compared with a real unprotected run of
  :func:`labkit.scenarios.expired_but_alive`, boundaries included.
"""

from __future__ import annotations

from random import Random

from labkit.grading import BOOL, Schedule, expect, hostile, task
from labkit.sim.history import Event


# ---------------------------------------------------------------- 01.1: lost updates in a history


def _story(rng: Random, story: str) -> list:
    """A recorded history: a story of the lesson, or a random one over a few invoices."""
    events = []
    clock = [rng.choice([0.0, 100.0, 3600.0])]  # a list, so that ev() can move it

    def ev(worker, action, outcome="ok", gen=None, target=None, until=None):
        clock[0] += rng.choice([0.25, 0.5, 1.0, 1.5, 2.0, 5.0])
        events.append(Event(clock[0], worker, action, outcome, gen, target=target, until=until))

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
    elif story == "chain":  # each trap beside lost writes the overwriting ones overlap
        ev("F", "write", "ok", 20, "INV-4")
        ev("D", "write", "ok", 6, "INV-3")
        ev("C", "write", "ok", 9, "INV-1")
        ev("B", "write", "ok", 8, "INV-1")
        ev("A", "write", "ok", 7, "INV-1")  # C's and B's INV-1 are lost
        ev("G", "write", "ok", 30, "INV-2")
        ev("G", "write", "ok", 30, "INV-2")
        ev("H", "write", "ok", 40, "INV-5")
        ev("E", "write", "rejected", 5, "INV-5")
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
    return events


LOST_HOSTILE = hostile(
    "story",
    ("the lesson's story: A's 7 lands on B's 8", "lesson"),
    ("the same story behind a fence: A's write is rejected", "fenced"),
    ("three workers, three lost writes, and writes that look alike", "several"),
    ("a clean history with rejected and crashed writes", "clean"),
    ("a chain of lost writes beside one trap of each mistake", "chain"),
)


#: the properties of 01.1 (each but the order comes with typical mistakes, below)
LOST_PROPS = {
    "victims": "every lost write is reported: the victim, not the write that replaced it",
    "committed": "rejected and crashed writes changed nothing: never lost, never replacing",
    "newer or equal": "a newer or an equal generation replacing a write loses nothing",
    "per invoice": "writes to different invoices never affect each other",
    "in order": "the lost writes come once each, in the order they appear in the history",
}


def _finder(events, *, counts=("ok",), invoice=True, equal=False, top=False, replacers=False):
    """The indices of the lost writes as the rule says (by default) or as a mistake reads it:
    every outcome counted, invoices ignored, an equal generation lost, the highest generation
    ever the reference, or the replacing writes reported instead of their victims."""
    last, high, lost = {}, {}, set()
    for i, e in enumerate(events):
        if e.action != "write" or e.outcome not in counts:
            continue
        key = e.target if invoice else None
        if key in last:
            ref = high[key] if top else events[last[key]].generation
            if e.generation < ref or (equal and e.generation == ref):
                lost.add(i if replacers else last[key])
        last[key], high[key] = i, max(high.get(key, e.generation), e.generation)
    return lost


@task(
    "01.1",
    "finding the lost updates",
    LOST_HOSTILE,
    count=40,
    returns=(list, tuple),
    properties=LOST_PROPS,
)
def lost_updates_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 01.1: ``answer(history) -> the committed writes whose work was lost``.

    A wrong set breaks the property whose mistake explains most of its errors (else the
    victims'); a property held only where the answer found a lost write and a mistake of it
    would have gone wrong, the order only where it returned the writes of a finder."""
    events = _story(schedule.rng, schedule.knobs["story"])
    history.extend(events)
    got = list(answer(list(events)))
    index = {e: i for i, e in enumerate(events)}
    foreign = [e for e in got if e not in index]
    if foreign:
        detail = f"{foreign[0]!r} is not in it"
        expect(False, "find_lost_updates returns events of the history", detail, prop="victims")
    want, ids = _finder(events), [index[e] for e in got]
    errors, why, ordered = want ^ set(ids), {}, ids == sorted(set(ids))
    mistakes = [
        ("committed", _finder(events, counts=("ok", "rejected", "crashed"))),
        ("newer or equal", _finder(events, equal=True)),
        ("newer or equal", _finder(events, top=True)),
        ("per invoice", _finder(events, invoice=False)),
        ("victims", _finder(events, replacers=True)),
    ]
    for p, m in mistakes:
        told = len({i for i in errors if (i in m) == (i in ids)}) + (m == set(ids)) / 2
        why[p] = max(why.get(p, 0), told)
    broken = max(why, key=why.get) if errors and max(why.values()) else "victims"
    if errors and schedule.knobs["story"] == "random":  # a row no property is meant for
        exact = {p for p, m in mistakes if m == set(ids)}  # blames only a mistake it is, alone:
        if len(exact) != 1:  # else a tie (or a near miss) blames another property by chance
            return
        (broken,) = exact
    found = [want] + [m for _, m in mistakes]  # the sets a finder gives: order is judged there
    hit = want & set(ids)  # a trap avoided counts only where it found a lost write, in a story
    story_meant = schedule.knobs["story"] != "random"  # meant for it: luck is no proof
    finders = set(ids) <= want.union(*(m for _, m in mistakes))  # it returned what some rule finds
    hit = hit if story_meant and finders else set()  # (a slice of the history finds by position)
    for p, m in mistakes:  # the traps this answer avoided
        trap = m - want
        if p != broken and hit and (trap and not trap & set(ids) or not errors and m != want):
            expect(True, LOST_PROPS[p], prop=p)

    def show(picked) -> str:
        told = [f"{e.worker}'s {e.target} (gen {e.generation}, t={e.time:g})" for e in picked]
        return ", ".join(told) or "none"

    if len(ids) > 1 and set(ids) in found and (ordered or not errors) and story_meant:
        expect(ordered, LOST_PROPS["in order"], f"they came as {show(got)}", prop="in order")
    expect(
        not errors,
        "the lost writes are exactly the committed writes whose next committed write to the "
        "same invoice carries a lower generation",
        f"expected {show(events[i] for i in sorted(want))}; got {show(got)}",
        prop=broken,
    )


# ---------------------------------------------------------------- 01.2: predicting the overwrite


#: 01.2's properties: each holds pauses where A overwrites B and pauses where it does not
EDGES = (-0.25, 1.75)  # pause - ttl: from just before the expiry to just after B writes INV-1
PREDICT_PROPS = {
    "far": "right when A wakes well before its lease expires or well after B has written",
    "edges": "right from a quarter second before the lease expires to a quarter second "
    "after B writes INV-1, ties included",
}


GRID = 1024  # per second: sums stay exact (a tie is a tie), too fine for a table of inputs


def _overwrite_knobs(rng: Random) -> dict:
    """Half the pauses near the edges (whole quarter seconds from the expiry: the ties exact),
    half far before or after, over leases of 0.5 to 120 s on a 1/1024 s grid: too many to keep
    a table of."""
    if rng.random() < 0.5:
        ttl = rng.randrange(10 * GRID // 4, 120 * GRID + 1) / GRID
        return {"pause": ttl + rng.randrange(-1, 8) / 4, "ttl": ttl}
    ttl = rng.randrange(GRID // 2, 120 * GRID + 1) / GRID
    far = rng.choice([-rng.randrange(2, int(4 * ttl) + 1), rng.randrange(8, int(12 * ttl) + 120)])
    return {"pause": ttl + far / 4, "ttl": ttl}


def _overwrite_vary(knobs: dict, rng: Random) -> dict:
    """A hostile row with numbers of the run: an edge keeps its distance from the expiry (the
    lease grows by up to a minute, on the grid), a far one its ratio of pause to lease (scaled
    by 1 to 3x)."""
    pause, ttl = knobs["pause"], knobs["ttl"]
    if EDGES[0] <= pause - ttl <= EDGES[1]:
        grow = rng.randrange(0, 60 * GRID + 1) / GRID
        return {"pause": pause + grow, "ttl": ttl + grow}
    scale = 1 + rng.randrange(0, 2 * GRID + 1) / GRID
    return {"pause": pause * scale, "ttl": ttl * scale}


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
    ("a long lease, A wakes up a quarter second after B wrote INV-1", 61.75, 60.0),
)


@task(
    "01.2",
    "predicting the overwrite",
    OVERWRITE_HOSTILE,
    count=24,
    make=_overwrite_knobs,
    returns=BOOL,
    properties=PREDICT_PROPS,
    vary=_overwrite_vary,
)
def overwrite_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 01.2: ``answer(pause, ttl) -> bool``, compared with a real unprotected run."""
    from labkit.scenarios import expired_but_alive

    pause, ttl = schedule.knobs["pause"], schedule.knobs["ttl"]
    run = expired_but_alive(protected=False, pause=pause, ttl=ttl)
    history.extend(run.history)
    prop = "edges" if EDGES[0] <= pause - ttl <= EDGES[1] else "far"
    (a_gen,) = {e.generation for e in run.history if e.worker == "A" and e.action == "acquire"}
    final = {r["invoice_id"]: r["generation"] for r in run.tables["invoices"]}
    truth = final["INV-1"] == a_gen
    got = answer(pause, ttl)
    rule = "predict_overwrite returns True or False"
    expect(isinstance(got, (bool, int)) and got in (0, 1), rule, f"it returned {got!r}", prop=prop)
    expect(
        bool(got) == truth,
        f"the prediction matches the real run: with pause={pause!r} s and ttl={ttl!r} s, "
        f"A {'does' if truth else 'does not'} overwrite B's INV-1",
        f"predict_overwrite({pause!r}, {ttl!r}) returned {got!r}; in the run, INV-1 ended "
        f"with generation {final['INV-1']}",
        prop=prop,
    )
