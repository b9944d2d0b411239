"""The verdict: run a task's schedules against an answer and say which properties held.

A trial (``trial(answer, schedule, history)``, registered with :func:`task`) judges one schedule;
each :func:`expect` is evidence for one property. :func:`verdict` runs every schedule of a task:
a race row marked ``each`` puts the rival at every statement boundary the call reaches (one
schedule per boundary, until the call finishes first, at most :data:`BOUNDARIES`). A property
scores when some schedule checked it and none broke it; each broken property reports its
shortest failing schedule. The judge (:mod:`labkit.grading.judge`) calls down into this
module, never the other way round.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
import sys
from dataclasses import dataclass, field
from random import Random
from typing import Any, Callable, Iterable

from labkit.errors import BadArgument, LabkitError
from labkit.grading import lab
from labkit.grading.scores import Failure, Finding, Report, unrun

__all__ = ["Broken", "Refused", "Task", "expect", "expect_all", "task", "verdict", "refused"]
__all__ += ["tasks_loaded", "PROBLEMS", "CHECK_MODULES", "BOUNDARIES", "schedule_of"]

#: The modules that register tasks, the shared helpers first; (re)loaded in this order.
CHECK_MODULES = (
    "labkit.grading.lab",
    "labkit.grading.writers",
    "labkit.grading.fenced",
    *(f"labkit.grading.checks{lesson:02}" for lesson in range(1, 10)),
    *(f"labkit.grading.checks{part}" for part in ("04b", "05b", "06b", "07b")),
)
#: the result types tasks declare, after JSON decoding (a bool may come back as the int 0 or 1)
BOOL, NUMBER, NONE = (bool, int), (float, int), type(None)
#: the statements of one call that the rival is put before, one schedule each, at most
BOUNDARIES = 200
#: an enumerated schedule's seed: its row's seed plus this times its distance from the row's boundary
SPREAD = 10**6


class Refused(BaseException):
    """The answer's process broke the rules of the boundary: it died, went silent, took too long
    or sent what is not a plain value. A BaseException, so that no trial's ``except`` eats it."""


class Broken(Exception):
    """Raised inside a trial when a property does not hold (use :func:`expect`)."""

    def __init__(self, prop: str, rule: str, detail: str = "", more: tuple = ()) -> None:
        self.prop, self.rule, self.detail, self.more = prop, rule, detail, more
        super().__init__(f"{prop}: {rule}: {detail}")


#: the properties checked in the schedule that runs now, and the breaks it went on after
_EVIDENCE: list[set] = []
_LATER: list[list] = []


def expect(condition: bool, rule: str, detail: str = "", prop: str = "") -> None:
    """One piece of evidence for the property ``prop``: it held if ``condition`` does, else
    raise :class:`Broken` naming it, the ``rule`` the trial checked and what it observed."""
    if not condition:
        raise Broken(prop, rule, detail)
    if _EVIDENCE:
        _EVIDENCE[-1].add(prop)


def expect_all(checks, *, acted: bool = True, go_on: bool = False) -> None:
    """Judge every ``(condition, rule, detail, prop)`` of one step, then raise one Broken for all
    that broke (``more`` holds the rest): a rule that held is evidence even beside a broken one,
    but only if the answer ``acted`` (a call that did nothing can break rules, not keep them).
    With ``go_on`` (a trial whose next steps do not rely on this one) the schedule goes on, and
    the break counts when it ends."""
    broken = []
    for condition, rule, detail, prop in checks:
        try:
            if acted or not condition:
                expect(condition, rule, detail, prop)
        except Broken as b:
            broken.append(b)
    if broken:
        first = broken[0]
        b = Broken(first.prop, first.rule, first.detail, more=tuple(broken[1:]))
        if not (go_on and _LATER):
            raise b
        _LATER[-1].append(b)


#: why an answer scores nothing at all: it is not written, crashed, or broke the boundary
PROBLEMS = {
    "written": "the answer is written",
    "bounded": f"the answer sends at most {BOUNDARIES} SQL statements in one call",
    "runs": "the answer runs without an unexpected error",
    "plain": "the answer runs in its sandbox and returns plain values",
}


@dataclass(frozen=True, slots=True)
class Task:
    """A registered task: id, title, the trial function, its schedules, the types its answer
    may return (after JSON decoding; empty: whatever the trial judges), and its properties
    (name -> plain words), in order."""

    id: str
    title: str
    trial: Callable[[Any, lab.Schedule, list], None]
    schedules: tuple
    returns: tuple = ()
    properties: dict = field(default_factory=dict, hash=False)
    draw: Callable | None = field(default=None, hash=False, compare=False)

    def rows(self, run: int | None) -> tuple:
        """The schedules of the grading run seeded ``run`` (None: :attr:`schedules`, the fixed
        draws of a run without a seed): the same hostile rows, random rows of its own."""
        return self.schedules if run is None or self.draw is None else tuple(self.draw(run))


_REGISTRY: dict[str, Task] = {}  # filled by the check modules, loaded on first use of TASKS


def _random_story(rng: Random) -> dict:
    return {"story": "random"}


def task(
    task_id: str,
    title: str,
    hostile: Iterable[dict],
    *,
    count=0,
    make=_random_story,
    returns=(),
    properties: dict,
    vary=None,
):
    """Register ``trial(answer, schedule, history)`` as the check for ``task_id``.

    It runs under the ``hostile`` schedules, then ``count`` random ones whose knobs
    ``make(rng)`` draws (by default ``{"story": "random"}``); see :func:`schedules`.
    ``returns`` are the types an answer may return, e.g. ``(float, int)``; ``properties``
    name what the trial checks (name -> plain words), each worth its share of the points;
    ``vary(knobs, rng)`` redraws a hostile row's numbers in a run with a seed.
    """
    hostile = list(hostile)

    def draw(run):
        return lab.schedules(hostile, count=count, make=make, run=run, vary=vary)

    def register(trial):
        rows = tuple(draw(None))
        props = dict(properties or {"": title})
        _REGISTRY[task_id] = Task(task_id, title, trial, rows, tuple(returns), props, draw)
        return trial

    return register


def _run(t: Task, answers, schedule, history: list, seen: set, later: list) -> dict:
    """Run one schedule on the answer ``answers()`` yields: ``seen`` gets the properties that
    held, ``later`` the breaks (Broken); an answer that cannot run raises a problem's Broken.
    Returns what the rival saw: ``came`` (the call reached its boundary), ``keys`` (those it
    reached before)."""
    came: dict = {}
    _EVIDENCE.append(seen), _LATER.append(later), lab.RIVAL.append(came)
    # the answer's own ``random`` is seeded by the schedule's inputs (in its sandboxed process, or
    # here in a replay): a call that draws how many statements to send draws the same in the probe
    # and at each boundary, and a replay reproduces it
    luck, state = schedule.rng.getrandbits(64), random.getstate()
    lab.LUCK.append(luck), random.seed(luck)
    try:
        with answers() as answer:
            t.trial(answer, schedule, history)
    except Broken as b:
        if b.prop in PROBLEMS:  # a trial may find that the answer cannot run, too
            raise
        later.append(b)
    except Refused as exc:  # the sandbox's boundary: no evidence is a failure
        raise Broken("plain", "", str(exc)) from None
    except NotImplementedError:
        raise Broken("written", "", "it still raises NotImplementedError") from None
    except Exception as exc:  # the answer crashed: it scores nothing
        raise Broken("runs", "", f"{type(exc).__name__}: {exc}") from None
    finally:
        _EVIDENCE.pop(), _LATER.pop(), lab.RIVAL.pop(), lab.LUCK.pop(), random.setstate(state)
    return came


def _task(task_id: str) -> Task:
    tasks = tasks_loaded()
    if task_id not in tasks:
        raise BadArgument("task_id", f"no task {task_id!r}; the tasks are {sorted(tasks)}")
    return tasks[task_id]


def _later(t: Task, rows: tuple, schedule, rival: dict, fronts: dict) -> list:
    """The schedules after ``schedule`` if its row names its boundary's knob in ``each``: first,
    if the rival came, one where it never does (the call runs whole: its boundaries, and the
    other order); then one per boundary of the call (:func:`~labkit.grading.lab.boundary`) not
    yet tried, in the order they were found (boundaries of a call that varies are found too)."""
    key = schedule.knobs.get("each")
    if not key:
        return []
    row = rows[schedule.seed % SPREAD]
    front = fronts.setdefault(row.seed, {"found": [], "tried": set(), "next": 1})
    front["tried"].add(schedule.knobs[key])
    front["found"] += [k for k in rival.get("keys", []) if k not in front["found"]]
    if schedule is row:  # tried: only the boundary its own rival came to; the rows before it
        # may have met other statements (a call whose statements vary with its own random)
        front["tried"].update(rival.get("keys", [])[-1:] if rival.get("came") else [])
        return [_boundary(t, row, front, "end")] if rival.get("came") else []
    todo = [k for k in front["found"] if k not in front["tried"]]
    if todo and len(front["tried"]) > BOUNDARIES:
        why = f"the call still ran SQL past {BOUNDARIES} statements, where the judge stops"
        raise Broken("bounded", "", why)
    return [_boundary(t, row, front, todo[0])] if todo else []


def _boundary(t: Task, row, front: dict, at: str):
    front["next"] += 1
    seed = row.seed + SPREAD * (front["next"] - 1)
    if at == "end":
        name = "the rival after the whole call (the other order)"
    else:
        name = f"the rival just before {at} (each boundary the call reaches)"
    knobs = dict(row.knobs, **{row.knobs["each"]: at}, inputs=row.seed)
    return lab.Schedule(seed, knobs, name, row.run)


def schedule_of(t: Task, seed: int, probe=None, run: int | None = None):
    """The schedule of ``t`` with ``seed`` in the run seeded ``run``: a row of its own, or a
    boundary of an ``each`` row (``probe(row)`` gives the boundaries the call reaches, in order)."""
    rows = {s.seed: s for s in t.rows(run)}
    row = (rows.get(seed) or rows.get(seed % SPREAD)) if isinstance(seed, int) else None
    if row is None or seed not in rows and not (seed > 0 and row.knobs.get("each")):
        raise BadArgument(
            "seed",
            f"task {t.id} has no schedule with seed {seed!r}; its seeds are "
            f"{sorted(rows)} (and boundaries of the rows marked each)",
        )
    if seed in rows:
        return row
    front = {"found": [], "tried": set(), "next": 1}
    found = probe(row) if probe and seed // SPREAD > 1 else []
    raced = found[row.knobs[row.knobs["each"]] - 1 : row.knobs[row.knobs["each"]]]
    untried = ["end"] + [k for k in found if k not in raced]
    if seed // SPREAD > len(untried):
        raise BadArgument("seed", f"seed {seed}: the call reaches {len(found)} boundaries")
    front["next"] = seed // SPREAD
    return _boundary(t, row, front, untried[seed // SPREAD - 1])


def draw_seed() -> int:
    """A grading run's seed, from the operating system: no answer can know its inputs ahead."""
    import secrets

    return secrets.randbits(32)


def verdict(task_id: str, answers, name: str, *, run: int | None = None) -> Report:
    """Run every schedule of ``task_id`` in the run seeded ``run`` (None: one drawn from the
    operating system; the report records it); ``answers()`` gives a context yielding the answer for
    one schedule. Each property's finding is how many schedules checked it and it held, and the
    shortest schedule (fewest events) that broke it. An answer that crashes, is not written or is
    refused by the sandbox stops the trial: it scores nothing."""
    t, run = _task(task_id), draw_seed() if run is None else run
    rows = t.rows(run)
    held, broken, todo, fronts = dict.fromkeys(t.properties, 0), {}, list(rows), {}
    while todo:
        schedule, seen, history, later = todo.pop(0), set(), [], []
        try:
            rival = _run(t, answers, schedule, history, seen, later)
            todo[:0] = _later(t, rows, schedule, rival, fronts)
        except Broken as b:  # only a problem comes out: the answer scores nothing
            problem = Finding(b.prop, PROBLEMS[b.prop], 0, _failure(b, schedule, history))
            return Report(t.id, t.title, name, _found(t, held, broken), problem, run)
        for each in (b for first in later for b in (first, *first.more)):
            seen.add(each.prop)
            failure = _failure(each, schedule, history)
            if each.prop not in broken or len(failure.events) < len(broken[each.prop].events):
                broken[each.prop] = failure  # the shortest failing schedule
        if seen - set(t.properties):
            raise LabkitError(
                f"task {t.id}: its trial checks {seen - set(t.properties)}, "
                f"which it does not declare ({sorted(t.properties)})"
            )
        for prop in seen - set(broken):
            held[prop] += 1
    return Report(t.id, t.title, name, _found(t, held, broken), run=run)


def _failure(b: Broken, schedule, history: list) -> Failure:
    """Where ``b`` broke, its knobs and events as JSON gives them back (the check cell, the
    grader and the feedback page then show the same)."""
    import json

    knobs, events = json.loads(json.dumps([schedule.knobs, list(map(dataclasses.asdict, history))]))
    return Failure(
        b.rule, b.detail, schedule.name, schedule.seed, knobs, tuple(events), schedule.run
    )


def _found(t: Task, held: dict, broken: dict) -> tuple[Finding, ...]:
    return tuple(Finding(p, w, held[p], broken.get(p)) for p, w in t.properties.items())


def refused(task_id: str, why: str, name: str = "answer") -> Report:
    """The report of ``task_id`` when its answer could not be run at all (``why``)."""
    t = tasks_loaded().get(task_id) or Task(task_id, task_id, print, ())
    return unrun(t.id, why, title=t.title, answer=name, props=t.properties)


_LOADED: list = []


def tasks_loaded() -> dict[str, Task]:
    """The tasks, their check modules (re)loaded on first use after an import or a reload of
    this module (the judge starts its sandbox meanwhile; a reload binds every name afresh)."""
    if not _LOADED:
        _LOADED.append(True)
        for name in CHECK_MODULES:
            module = sys.modules.get(name)
            if module is None:
                importlib.import_module(name)
            else:
                importlib.reload(module)
    return _REGISTRY
