"""Grading checks: run a student's answer under many schedules and say exactly what broke.

A check cell runs ``importlib.reload(labkit.grading).check("02.1", fenced_insert)``.
Reloading re-executes this module and the check modules, so an answer cell that
rebinds or monkeypatches ``labkit.grading`` counts for nothing. On success the
check prints one fixed line (nbval compares it with the stored one); on failure
it raises :class:`CheckFailed` naming the property, the schedule's seed and a
one-line call that replays it as a timeline. Tasks are registered with
:func:`task` in ``labkit/grading/checksNN.py``, on the laboratory of
:mod:`labkit.grading.lab`.
"""

from __future__ import annotations

import importlib
from random import Random
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from labkit.errors import BadArgument, LabkitError

__all__ = ["check", "replay", "task", "expect", "schedules", "hostile"]
__all__ += ["Schedule", "Broken", "CheckFailed", "TASKS", "PASS", "CHECK_MODULES"]

PASS = "PASS {task}: {title} held under every schedule"

#: The modules that register tasks, the shared helpers first; reloading this module
#: reloads them all, in this order.
CHECK_MODULES = (
    "labkit.grading.lab",
    "labkit.grading.writers",
    *(f"labkit.grading.checks{lesson:02}" for lesson in range(1, 10)),
)


@dataclass(frozen=True, slots=True)
class Schedule:
    """One way the world can go during a trial.

    Attributes:
        seed: seeds the trial's ``random.Random`` (:attr:`rng`, fresh on every read).
        knobs: named timings or choices, e.g. ``{"pause": 30, "ttl": 10}``.
        name: a short label for hostile schedules, e.g. ``"A pauses inside the transaction"``.
    """

    seed: int
    knobs: dict = field(default_factory=dict, hash=False)
    name: str = "random"

    @property
    def rng(self) -> Random:
        return Random(self.seed)


def hostile(columns: str, *rows: tuple) -> list[dict]:
    """Hostile schedules as a table: each row is a name, then the knobs named in ``columns``.

    A shorter row leaves out the last knobs.
    """
    keys = ["name", *columns.split()]
    return [dict(zip(keys, row)) for row in rows]


def schedules(
    hostile: Iterable[dict], *, count: int, make: Callable[[Random], dict], base: int = 1000
) -> list[Schedule]:
    """The hostile schedules (dicts of a ``name`` and knobs), then ``count`` random ones.

    The random ones have seeds ``base``, ``base + 1``, ... and knobs ``make(Random(seed))``.
    """
    out = [
        Schedule(i, {k: v for k, v in h.items() if k != "name"}, h.get("name", f"hostile {i}"))
        for i, h in enumerate(hostile)
    ]
    out += [Schedule(s, make(Random(s))) for s in range(base, base + count)]
    return out


class Broken(Exception):
    """Raised inside a trial when a property does not hold (use :func:`expect`)."""

    def __init__(self, prop: str, detail: str) -> None:
        self.prop, self.detail = prop, detail
        super().__init__(f"{prop}: {detail}")


def expect(condition: bool, prop: str, detail: str = "") -> None:
    """Raise :class:`Broken` naming ``prop`` unless ``condition`` holds."""
    if not condition:
        raise Broken(prop, detail)


class CheckFailed(LabkitError, AssertionError):
    """A student's answer broke a property under one schedule.

    Attributes: ``task`` (the id, e.g. ``"02.1"``), ``prop`` (the property, in words),
    ``schedule`` (the :class:`Schedule` that broke it), ``detail`` (what was observed).
    """

    def __init__(
        self, task_id: str, prop: str, schedule: Schedule, detail: str, answer_name: str
    ) -> None:
        self.task, self.prop, self.schedule, self.detail = task_id, prop, schedule, detail
        super().__init__(
            f"task {task_id}: {prop}\n  observed: {detail}\n"
            f"  schedule: {schedule.name} (seed {schedule.seed}, knobs {schedule.knobs})\n"
            f"  replay it: labkit.grading.replay({task_id!r}, {answer_name}, seed={schedule.seed})"
        )


@dataclass(frozen=True, slots=True)
class Task:
    """A registered task: id, title, the trial function and its schedules."""

    id: str
    title: str
    trial: Callable[[Any, Schedule, list], None]
    schedules: tuple


TASKS: dict[str, Task] = {}


def _random_story(rng: Random) -> dict:
    return {"story": "random"}


def task(task_id: str, title: str, hostile: Iterable[dict], *, count: int = 0, make=_random_story):
    """Register ``trial(answer, schedule, history)`` as the check for ``task_id``.

    It runs under the ``hostile`` schedules, then ``count`` random ones whose knobs
    ``make(rng)`` draws (by default ``{"story": "random"}``); see :func:`schedules`.
    """
    runs = tuple(schedules(hostile, count=count, make=make))

    def register(trial):
        TASKS[task_id] = Task(task_id, title, trial, runs)
        return trial

    return register


def _run(t: Task, answer, schedule: Schedule, history: list) -> None:
    try:
        t.trial(answer, schedule, history)
    except Broken:
        raise
    except NotImplementedError:
        raise Broken("the answer is written", "it still raises NotImplementedError") from None
    except Exception as exc:  # the answer crashed: that is a failed property too
        detail = f"{type(exc).__name__}: {exc}"
        raise Broken("the answer runs without an unexpected error", detail) from None


def _task(task_id: str) -> Task:
    if task_id not in TASKS:
        raise BadArgument("task_id", f"no task {task_id!r}; the tasks are {sorted(TASKS)}")
    return TASKS[task_id]


def check(task_id: str, answer: Any) -> None:
    """Run ``answer`` through every schedule of ``task_id``; print the pass line.

    Raises :class:`CheckFailed` (the property, the seed, a replay call) or BadArgument (no such task).
    """
    t = _task(task_id)
    name = getattr(answer, "__name__", "answer")
    for schedule in t.schedules:
        try:
            _run(t, answer, schedule, [])
        except Broken as b:
            raise CheckFailed(task_id, b.prop, schedule, b.detail, name) from None
    print(PASS.format(task=task_id, title=t.title))


def replay(task_id: str, answer: Any, *, seed: int, ax=None):
    """Re-run the schedule ``seed`` of ``task_id``; return the matplotlib axes of its timeline."""
    from labkit.sim.engine import Result
    from labkit.sim.history import check as find
    from labkit.views.plot import timeline

    t = _task(task_id)
    seeds = [s.seed for s in t.schedules]
    if seed not in seeds:
        why = f"task {task_id} has no schedule with seed {seed!r}; its seeds are {seeds}"
        raise BadArgument("seed", why)
    schedule, history = t.schedules[seeds.index(seed)], []
    try:
        _run(t, answer, schedule, history)
        verdict = f"task {task_id}: every property held (seed {seed})"
    except Broken as b:
        verdict = f"task {task_id}: {b.prop} broke (seed {seed})"
    params, found = dict(schedule.knobs, seed=seed), tuple(find(history))
    result = Result(
        params=params, history=tuple(history), tables={}, violations=found, verdict=verdict
    )
    return timeline(result, ax=ax)


def _load_checks() -> None:
    """(Re)load every check module, so that every name an answer cell patched is bound afresh."""
    for name in CHECK_MODULES:
        module = sys.modules.get(name)
        if module is None:
            importlib.import_module(name)
        else:
            importlib.reload(module)


_load_checks()
