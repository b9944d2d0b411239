"""Grading checks: run a student's answer under many schedules and say exactly what broke.

A check cell runs ``importlib.reload(labkit.grading).check("02.1", fenced_insert)``: it hands
the kernel's cells so far (``In``) to the judge, a process of its own (:mod:`labkit.grading.judge`)
that runs them in a sandbox and the task's trials against the answer there. It prints the task's
scorecard (:class:`~labkit.grading.scores.Report`: points per property; nbval compares it with
the stored one), or raises :class:`CheckFailed` with it: each broken property, its seed and a
call that replays it as a timeline. ``python -m labkit.grade`` judges the notebook file itself.
Tasks are registered with :func:`task` in ``labkit/grading/checksNN.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import sys
from pathlib import Path
from random import Random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from labkit.errors import BadArgument, LabkitError
from labkit.grading.lab import Schedule, hostile, schedules
from labkit.grading.scores import Failure, Finding, Report, unrun

__all__ = ["check", "replay", "task", "expect", "expect_all", "schedules", "hostile"]
__all__ += ["Schedule", "Broken", "CheckFailed", "TASKS", "PASS", "CHECK_MODULES"]
__all__ += ["verdict", "Report", "replayed", "refused"]

PASS = "PASS {task}: {title} held under every schedule"
#: the result types tasks declare, after JSON decoding (a bool may come back as the int 0 or 1)
BOOL, NUMBER, NONE = (bool, int), (float, int), type(None)

#: The modules that register tasks, the shared helpers first; reloading this module
#: reloads them all, in this order.
CHECK_MODULES = (
    "labkit.grading.lab",
    "labkit.grading.writers",
    *(f"labkit.grading.checks{lesson:02}" for lesson in range(1, 10)),
)


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
    "runs": "the answer runs without an unexpected error",
    "plain": "the answer runs in its sandbox and returns plain values",
}


class CheckFailed(LabkitError, AssertionError):
    """A student's answer did not score all its points: ``task`` is its id, the text is its
    scorecard (see :class:`~labkit.grading.scores.Report`), ``seed`` the first failing schedule
    (None: no trial ran). A notebook shows the text alone, with no traceback."""

    def __init__(self, task_id: str, text: str, seed: int | None = None) -> None:
        self.task, self.seed = task_id, seed
        super().__init__(text)

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"{type(self).__name__}: {self}"]


@dataclass(frozen=True, slots=True)
class Task:
    """A registered task: id, title, the trial function, its schedules, the types its answer
    may return (after JSON decoding; empty: whatever the trial judges), and its properties
    (name -> plain words), in order."""

    id: str
    title: str
    trial: Callable[[Any, Schedule, list], None]
    schedules: tuple
    returns: tuple = ()
    properties: dict = field(default_factory=dict, hash=False)


_REGISTRY: dict[str, Task] = {}  # filled by the check modules, loaded on first use of TASKS


def _random_story(rng: Random) -> dict:
    return {"story": "random"}


def task(
    task_id: str, title: str, hostile: Iterable[dict], *, count=0, make=_random_story, returns=(),
    properties: dict,
):  # fmt: skip
    """Register ``trial(answer, schedule, history)`` as the check for ``task_id``.

    It runs under the ``hostile`` schedules, then ``count`` random ones whose knobs
    ``make(rng)`` draws (by default ``{"story": "random"}``); see :func:`schedules`.
    ``returns`` are the types an answer may return, e.g. ``(float, int)``; ``properties``
    name what the trial checks (name -> plain words), each worth its share of the points.
    """
    runs = tuple(schedules(hostile, count=count, make=make))

    def register(trial):
        _REGISTRY[task_id] = Task(
            task_id, title, trial, runs, tuple(returns), dict(properties or {"": title})
        )
        return trial

    return register


def _run(t: Task, answers, schedule: Schedule, history: list, seen: set, later: list) -> None:
    """Run one schedule on the answer ``answers()`` yields: ``seen`` gets the properties that
    held, ``later`` the breaks (Broken); an answer that cannot run raises a problem's Broken."""
    from labkit.grading.judge import Refused

    _EVIDENCE.append(seen), _LATER.append(later)
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
        _EVIDENCE.pop(), _LATER.pop()


def _task(task_id: str) -> Task:
    tasks = tasks_loaded()
    if task_id not in tasks:
        raise BadArgument("task_id", f"no task {task_id!r}; the tasks are {sorted(tasks)}")
    return tasks[task_id]


def verdict(task_id: str, answers, name: str) -> Report:
    """Run every schedule of ``task_id``; ``answers()`` gives a context yielding the answer for
    one schedule. Each property's finding is how many schedules checked it and it held, and the
    first that broke it. An answer that crashes, is not written or is refused by the sandbox
    stops the trial: it scores nothing."""
    t = _task(task_id)
    held, broken = dict.fromkeys(t.properties, 0), {}
    for schedule in t.schedules:
        seen, history, later = set(), [], []
        try:
            _run(t, answers, schedule, history, seen, later)
        except Broken as b:  # only a problem comes out: the answer scores nothing
            problem = Finding(b.prop, PROBLEMS[b.prop], 0, _failure(b, schedule, history))
            return Report(t.id, t.title, name, _found(t, held, broken), problem)
        for each in (b for first in later for b in (first, *first.more)):
            seen.add(each.prop)
            broken.setdefault(each.prop, _failure(each, schedule, history))
        if seen - set(t.properties):
            raise LabkitError(f"task {t.id}: its trial checks {seen - set(t.properties)}, "
                              f"which it does not declare ({sorted(t.properties)})")  # fmt: skip
        for prop in seen - set(broken):
            held[prop] += 1
    return Report(t.id, t.title, name, _found(t, held, broken))


def _failure(b: Broken, schedule: Schedule, history: list) -> Failure:
    """Where ``b`` broke, its knobs and events as JSON gives them back (the check cell, the
    grader and the feedback page then show the same)."""
    import json

    knobs, events = json.loads(json.dumps([schedule.knobs, list(map(dataclasses.asdict, history))]))
    return Failure(b.rule, b.detail, schedule.name, schedule.seed, knobs, tuple(events))


def _found(t: Task, held: dict, broken: dict) -> tuple[Finding, ...]:
    return tuple(Finding(p, w, held[p], broken.get(p)) for p, w in t.properties.items())


def refused(task_id: str, why: str, name: str = "answer") -> Report:
    """The report of ``task_id`` when its answer could not be run at all (``why``)."""
    t = tasks_loaded().get(task_id) or Task(task_id, task_id, print, ())
    return unrun(t.id, why, title=t.title, answer=name, props=t.properties)


def check(task_id: str, answer: Any) -> None:
    """Judge the kernel's cells so far (``In``) for ``task_id`` out of process; print the
    scorecard. Raises :class:`CheckFailed` (with it), or BadArgument (no such task, no notebook)."""
    import json
    import subprocess

    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    name = getattr(answer, "__name__", "")
    if not shell or "In" not in shell.user_ns:
        _task(task_id)  # an unknown task is named first
        raise BadArgument("answer", "check() judges a notebook's cells: run it in a notebook")
    if not name.isidentifier():
        raise BadArgument("answer", f"must be a function the notebook defines, got {answer!r}")
    sources = [s for s in shell.user_ns["In"][1:] if isinstance(s, str)]
    if not sources or "check(" not in sources[-1]:  # nbval runs cells without history: the
        import linecache  # cells IPython compiled, in the order it compiled them, instead

        cached = [linecache.cache.get(name) for name in getattr(shell.compile, "_filename_map", ())]
        sources = ["".join(entry[2]) for entry in cached if entry]
    argv = [sys.executable, "-m", "labkit.grading.judge", task_id, name]
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with subprocess.Popen(argv, **pipes) as judge:  # it starts while the task id is looked up
        try:
            _task(task_id)
        except BadArgument:
            judge.kill()
            raise
        try:  # a judge bounds every task; this bounds the judge, whatever happens to it
            out, err = judge.communicate(json.dumps(sources), timeout=600)
        except subprocess.TimeoutExpired:
            judge.kill()
            out, err = "", "labkit.grading: the judge did not finish within 600 s\n"
    sys.__stderr__.write(err)  # never into the check cell's compared output
    lines = out.strip().splitlines()
    report = (
        Report.from_json(json.loads(lines[-1]))
        if lines
        else refused(task_id, "the judge failed", name)
    )
    if not report.passed:
        raise CheckFailed(task_id, report.text(), report.seed)
    print(report.text())


def replayed(task_id: str, answer: Any, *, seed: int):
    """Re-run the schedule ``seed`` of ``task_id`` in this process: the run as a Result (its
    history is what the trial saw the answer do, up to where a property broke)."""
    from labkit.sim.engine import Result
    from labkit.sim.history import check as find

    t = _task(task_id)
    seeds = [s.seed for s in t.schedules]
    if seed not in seeds:
        why = f"task {task_id} has no schedule with seed {seed!r}; its seeds are {seeds}"
        raise BadArgument("seed", why)
    schedule, history, later = t.schedules[seeds.index(seed)], [], []
    try:
        _run(t, lambda: contextlib.nullcontext(answer), schedule, history, set(), later)
        words = [t.properties.get(b.prop, b.prop) for first in later for b in (first, *first.more)]
    except Broken as b:
        words = [PROBLEMS[b.prop]]
    shown = "; ".join(dict.fromkeys(words))
    verdict = f"task {task_id}: broken: {shown} (seed {seed})" if words else (
        f"task {task_id}: every property held (seed {seed})")  # fmt: skip
    params, found = dict(schedule.knobs, seed=seed), tuple(find(history))
    return Result(
        params=params, history=tuple(history), tables={}, violations=found, verdict=verdict
    )


def replay(task_id: str, answer: Any, *, seed: int, ax=None) -> None:
    """Re-run the schedule ``seed`` of ``task_id`` and draw its timeline (on ``ax``, or a new
    figure); it returns nothing, so the notebook shows the picture and no ``<Axes ...>``."""
    from labkit.views.plot import timeline

    timeline(replayed(task_id, answer, seed=seed), ax=ax)


#: where :func:`keys` reads the answer keys: the course's own solutions/ unless the judge is
#: told otherwise (``--solutions``); the sandbox never sees it
SOLUTIONS = os.environ.get("LABKIT_SOLUTIONS") or str(
    Path(__file__).resolve().parents[2] / "solutions"
)


def keys(task_id: str) -> dict:
    """The answer key of a quiz task, from ``SOLUTIONS/keys.json``."""
    import json

    try:
        return json.loads((Path(SOLUTIONS) / "keys.json").read_text())[task_id]
    except (OSError, ValueError, KeyError) as exc:
        raise LabkitError(
            f"task {task_id}: no answer key in {SOLUTIONS}/keys.json ({exc})"
        ) from None


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


def __getattr__(name: str):
    if name == "TASKS":
        return tasks_loaded()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
