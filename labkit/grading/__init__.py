"""Grading checks: run a student's answer under many schedules and say exactly what broke.

This face only hands names on. On the kernel's side, :mod:`~labkit.grading.cells` is what a
check cell runs (``check``, ``replay``); it hands the notebook's cells to the judge, a process of
its own (:mod:`~labkit.grading.judge`, with ``sandbox``, ``worker``, ``wire`` and ``policy``),
which calls down into :mod:`~labkit.grading.verdicts` (the verdict and the task registry, filled
by the ``checksNN`` modules on ``lab`` and ``writers``) and never back.
"""

from labkit.grading.cells import PASS, CheckFailed, _judges, _made_for, check, replay, replayed
from labkit.grading.lab import Schedule, hostile, keys, schedules
from labkit.grading.scores import Report
from labkit.grading.verdicts import BOOL, CHECK_MODULES, NONE, NUMBER, PROBLEMS, Broken, Task
from labkit.grading.verdicts import expect, expect_all, refused, task, tasks_loaded, verdict

__all__ = ["check", "replay", "task", "expect", "expect_all", "schedules", "hostile"]
__all__ += ["Schedule", "Broken", "CheckFailed", "TASKS", "PASS", "CHECK_MODULES"]
__all__ += ["verdict", "Report", "replayed", "refused", "PROBLEMS", "Task", "tasks_loaded"]


def __getattr__(name: str):  # TASKS: the registry, its check modules loaded on first use
    if name == "TASKS":
        return tasks_loaded()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
