"""What a check cell runs, in the kernel: :func:`check`, :func:`replay` and the judge started ahead.

A check cell runs ``importlib.reload(labkit.grading).check("02.1", fenced_insert)``: it hands
the kernel's cells so far (``In``) to the judge, a process of its own (:mod:`labkit.grading.judge`)
that runs them in a sandbox and the task's trials against the answer there. It prints the task's
scorecard (:class:`~labkit.grading.scores.Report`: points per property; nbval compares it with
the stored one), or raises :class:`CheckFailed` with it: each broken property, its seed and a
call that replays it as a timeline (the judge's side never imports this module).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from labkit.errors import BadArgument, LabkitError
from labkit.grading import lab
from labkit.grading import verdicts as _verdict
from labkit.grading.forks import OwnLuck
from labkit.grading.scores import Report
from labkit.grading.verdicts import PROBLEMS, Broken, _run, _task, refused

__all__ = ["check", "replay", "replayed", "CheckFailed", "PASS"]

PASS = "PASS {task}: {title} held under every schedule"
#: judges started ahead for the next check (kept if this module is reloaded)
_judges: list = globals().get("_judges", [])


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
    _verdict._LOADED.clear()  # the checks load afresh: an answer cell may have changed them
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
    failed = refused(task_id, "the judge failed", name)
    report = Report.from_json(json.loads(lines[-1])) if lines else failed
    if not report.passed:
        raise CheckFailed(task_id, report.text(), report.seed)
    print(report.text())


def _start_judge():
    """A judge for the next check (``python -m labkit.grading.judge --ready``), started now so
    that its checks load and its fresh sandbox starts first; it ends when its stdin closes."""
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
        return _run(t, own_luck, at, [], set(), []).get("keys", [])

    def own_luck():  # each worker draws its random as its process in the sandbox would
        return contextlib.nullcontext(OwnLuck(answer, lab.LUCK[-1]))

    schedule, history, later = _verdict.schedule_of(t, seed, probe, run), [], []
    try:
        _run(t, own_luck, schedule, history, set(), later)
        words = [t.properties.get(b.prop, b.prop) for first in later for b in (first, *first.more)]
    except Broken as b:
        words = [PROBLEMS[b.prop]]
    held = f"broken: {'; '.join(dict.fromkeys(words))}" if words else "every property held"
    verdict = f"task {task_id}: {held} (seed {seed})"
    params, found = dict(schedule.knobs, seed=seed), tuple(find(history))
    warned = tuple(warnings(history))
    return Result(params, tuple(history), {}, found, verdict, warned)


def replay(task_id: str, answer: Any, *, seed: int, run: int | None = None, ax=None) -> None:
    """Re-run the schedule ``seed`` of ``task_id`` (of the run seeded ``run``) and draw its timeline (on ``ax``, or a new
    figure); it returns nothing, so the notebook shows the picture and no ``<Axes ...>``."""
    from labkit.views.plot import timeline

    timeline(replayed(task_id, answer, seed=seed, run=run), ax=ax)


if not _judges and getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)():
    _judges.append(_start_judge())  # a notebook imports the grader: its first check's judge
