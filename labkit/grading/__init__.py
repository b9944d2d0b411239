"""Grading checks: run a student's answer under many schedules and say exactly what broke.

A check cell in an exercise notebook looks like this::

    # NBVAL_CHECK_OUTPUT
    import importlib, labkit.grading
    importlib.reload(labkit.grading).check("02.1", fenced_insert)

Reloading re-executes this module and the check modules, so an answer cell
that rebinds or monkeypatches ``labkit.grading`` counts for nothing. On success
the check prints one fixed line (nbval compares it with the stored one); on
failure it raises :class:`CheckFailed` naming the property, the schedule's seed
and a one-line call that replays it as a timeline.

Writing a task (in the lesson's check module, ``labkit/grading/checksNN.py``, with the
shared laboratory of :mod:`labkit.grading.lab`)::

    @task("02.1", "the fenced insert", schedules(HOSTILE, count=20, make=random_knobs))
    def fenced_insert(answer, schedule, history):
        ...                       # run answer under schedule, append Events to history
        expect(rows == [], "a rejected write leaves no rows", f"found {rows}")

Each schedule is a :class:`Schedule` (seed + knobs): the hostile ones the lesson
names, then seeded random ones from :func:`schedules`.
"""

from __future__ import annotations

import importlib
from random import Random
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from labkit.errors import BadArgument, LabkitError

__all__ = [
    "check",
    "replay",
    "task",
    "expect",
    "schedules",
    "Schedule",
    "Broken",
    "CheckFailed",
    "TASKS",
    "PASS",
    "CHECK_MODULES",
]

PASS = "PASS {task}: {title} held under every schedule"

#: The modules that register tasks, and the helpers they share (first, so that
#: the lesson modules pick up the reloaded helpers). Reloading this module
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
        seed: seeds the trial's ``random.Random``.
        knobs: named timings or choices, e.g. ``{"pause": 30, "ttl": 10}``.
        name: a short label for hostile schedules, e.g. ``"A pauses inside the transaction"``.
    """

    seed: int
    knobs: dict = field(default_factory=dict, hash=False)
    name: str = "random"

    @property
    def rng(self) -> Random:
        """A fresh ``random.Random`` seeded with ``seed``."""
        return Random(self.seed)


def schedules(
    hostile: Iterable[dict], *, count: int, make: Callable[[Random], dict], base: int = 1000
) -> list[Schedule]:
    """Return the hostile schedules (dicts with ``name`` and knobs) then ``count`` random ones.

    Args:
        hostile: e.g. ``[{"name": "A pauses 30 s", "pause": 30}]``.
        count: how many seeded random schedules follow.
        make: builds random knobs from a seeded rng.
        base: the first random seed.
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

    Attributes:
        task: the task id, e.g. ``"02.1"``.
        prop: the property that broke, in words.
        schedule: the :class:`Schedule` that broke it.
        detail: what was observed.
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


def task(task_id: str, title: str, runs: Iterable[Schedule]):
    """Register ``trial(answer, schedule, history)`` as the check for ``task_id``."""

    def register(trial):
        TASKS[task_id] = Task(task_id, title, trial, tuple(runs))
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
        raise Broken(
            "the answer runs without an unexpected error", f"{type(exc).__name__}: {exc}"
        ) from None


def _task(task_id: str) -> Task:
    if task_id not in TASKS:
        raise BadArgument("task_id", f"no task {task_id!r}; the tasks are {sorted(TASKS)}")
    return TASKS[task_id]


def check(task_id: str, answer: Any) -> None:
    """Run ``answer`` through every schedule of ``task_id``; print the pass line or raise.

    Raises:
        CheckFailed: with the property, the seed and a replay call.
        BadArgument: no task ``task_id``.
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
    """Re-run one schedule of ``task_id`` and draw what happened as a timeline.

    Returns:
        The matplotlib axes of the timeline.
    """
    from labkit.views.plot import timeline
    from labkit.sim.engine import Result

    t = _task(task_id)
    schedule = next((s for s in t.schedules if s.seed == seed), None)
    if schedule is None:
        raise BadArgument(
            "seed",
            f"task {task_id} has no schedule with seed {seed!r}; "
            f"its seeds are {[s.seed for s in t.schedules]}",
        )
    history: list = []
    try:
        _run(t, answer, schedule, history)
        verdict = f"task {task_id}: every property held (seed {seed})"
    except Broken as b:
        verdict = f"task {task_id}: {b.prop} broke (seed {seed})"
    from labkit.sim.history import check as find

    result = Result(
        params=dict(schedule.knobs, seed=seed),
        history=tuple(history),
        tables={},
        violations=tuple(find(history)),
        verdict=verdict,
    )
    return timeline(result, ax=ax)


def _load_checks() -> None:
    """(Re)load every check module, so their tasks register against this module's TASKS.

    A reload re-executes a module in place: every name an answer cell patched
    (``expect``, a helper, a trial) is bound afresh from the source.
    """
    for name in CHECK_MODULES:
        module = sys.modules.get(name)
        if module is None:
            importlib.import_module(name)
        else:
            importlib.reload(module)


_load_checks()
