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
import os
import sys
from pathlib import Path
from typing import Any

from labkit.errors import BadArgument, LabkitError
from labkit.grading import verdicts as _verdict
from labkit.grading.lab import Schedule, hostile, schedules
from labkit.grading.scores import Report
from labkit.grading.verdicts import CHECK_MODULES, PROBLEMS, Broken, Task, _run, _task, expect
from labkit.grading.verdicts import expect_all, refused, task, tasks_loaded, verdict

__all__ = ["check", "replay", "task", "expect", "expect_all", "schedules", "hostile"]
__all__ += ["Schedule", "Broken", "CheckFailed", "TASKS", "PASS", "CHECK_MODULES"]
__all__ += ["verdict", "Report", "replayed", "refused", "PROBLEMS", "Task", "tasks_loaded"]

PASS = "PASS {task}: {title} held under every schedule"
#: judges started ahead for the next check (kept by importlib.reload, as check cells reload this)
_judges: list = globals().get("_judges", [])
#: the result types tasks declare, after JSON decoding (a bool may come back as the int 0 or 1)
BOOL, NUMBER, NONE = (bool, int), (float, int), type(None)


class CheckFailed(LabkitError, AssertionError):
    """A student's answer did not score all its points: ``task`` is its id, the text is its
    scorecard (see :class:`~labkit.grading.scores.Report`), ``seed`` the first failing schedule
    (None: no trial ran). A notebook shows the text alone, with no traceback."""

    def __init__(self, task_id: str, text: str, seed: int | None = None) -> None:
        self.task, self.seed = task_id, seed
        super().__init__(text)

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"{type(self).__name__}: {self}"]


def check(task_id: str, answer: Any, *, run: int | None = None) -> None:
    """Judge the kernel's cells so far (``In``) for ``task_id`` out of process, in the run seeded
    ``run`` (None: drawn from the operating system); print the scorecard. Raises :class:`CheckFailed` (with it), or BadArgument (no such task, no notebook)."""
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
    argv = [task_id, name] + ([] if run is None else [str(int(run))])
    with _ready_judge() as judge:  # started ahead, or now: it starts while the task is looked up
        try:
            _task(task_id)
        except BadArgument:
            judge.kill()
            raise
        request = json.dumps({"argv": argv, "cells": sources}) + "\n"  # one line: see main
        try:  # a judge bounds every task; this bounds the judge, whatever happens to it
            out, err = judge.communicate(request, timeout=600)
        except subprocess.TimeoutExpired:
            judge.kill()
            out, err = "", "labkit.grading: the judge did not finish within 600 s\n"
        except KeyboardInterrupt:  # its own session: the notebook's interrupt does not reach it
            judge.kill()
            raise
    with contextlib.suppress(OSError):  # no next judge now: the next check starts its own
        _judges.append(_start_judge())  # the next check's, ready while the student works
    sys.__stderr__.write(err)  # never into the check cell's compared output
    lines = [line for line in out.splitlines() if line.startswith("{")]  # not its "ready"
    report = (
        Report.from_json(json.loads(lines[-1]))
        if lines
        else refused(task_id, "the judge failed", name)
    )
    if not report.passed:
        raise CheckFailed(task_id, report.text(), report.seed)
    print(report.text())


def _start_judge():
    """A judge for the next check (``python -m labkit.grading.judge --ready``), started now so
    that its checks load and its fresh sandbox starts first; it ends when its stdin closes."""
    import subprocess

    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    argv = [sys.executable, "-m", "labkit.grading.judge", "--ready"]
    judge = subprocess.Popen(argv, **pipes, start_new_session=True)  # an interrupt: not its
    judge.made_for = _made_for()
    return judge


def _made_for() -> tuple:
    """What a judge started ahead depends on: the environment, the folder, the checks' code."""
    checks = max(p.stat().st_mtime_ns for p in Path(__file__).parent.glob("*.py"))
    return dict(os.environ), os.getcwd(), checks


def _ready_judge():
    """The judge started ahead for this check, if it is alive and was made for what is here
    now (others are ended); else one started now."""
    for judge in _judges[:]:
        _judges.remove(judge)
        if judge.poll() is None and judge.made_for == _made_for():
            return judge
        judge.kill()
        judge.communicate()
    return _start_judge()


def replayed(task_id: str, answer: Any, *, seed: int, run: int | None = None):
    """Re-run the schedule ``seed`` of ``task_id`` of the run seeded ``run`` (a report's; None:
    the fixed draws) in this process: the run as a Result (its history is what the trial saw
    the answer do, up to where a property broke)."""
    from labkit.sim.engine import Result
    from labkit.sim.history import check as find, warnings

    t = _task(task_id)

    def probe(row) -> list:  # the boundaries the answer's call reaches, in this process
        end = _verdict.SPREAD + row.seed
        at = _verdict.schedule_of(t, end, run=run)
        return _run(t, lambda: contextlib.nullcontext(answer), at, [], set(), []).get("keys", [])

    schedule, history, later = _verdict.schedule_of(t, seed, probe, run), [], []
    try:
        _run(t, lambda: contextlib.nullcontext(answer), schedule, history, set(), later)
        words = [t.properties.get(b.prop, b.prop) for first in later for b in (first, *first.more)]
    except Broken as b:
        words = [PROBLEMS[b.prop]]
    shown = "; ".join(dict.fromkeys(words))
    if words:
        verdict = f"task {task_id}: broken: {shown} (seed {seed})"
    else:
        verdict = f"task {task_id}: every property held (seed {seed})"
    params, found = dict(schedule.knobs, seed=seed), tuple(find(history))
    warned = tuple(warnings(history))
    return Result(params, tuple(history), {}, found, verdict, warned)


def replay(task_id: str, answer: Any, *, seed: int, run: int | None = None, ax=None) -> None:
    """Re-run the schedule ``seed`` of ``task_id`` (of the run seeded ``run``) and draw its timeline (on ``ax``, or a new
    figure); it returns nothing, so the notebook shows the picture and no ``<Axes ...>``."""
    from labkit.views.plot import timeline

    timeline(replayed(task_id, answer, seed=seed, run=run), ax=ax)


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


def __getattr__(name: str):
    if name == "TASKS":
        return tasks_loaded()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_verdict._LOADED.clear()  # a reload of this module (a check cell's) loads the checks afresh


if not _judges and getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)():
    _judges.append(_start_judge())  # a notebook imports the grader: its first check's judge
