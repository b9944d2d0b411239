"""Running a corpus answer the way a notebook does: define it, then check it as a check cell would.

``TAMPER`` holds answer-cell prefixes that tamper with the grader; each is pasted
before a wrong answer, and the check must still fail.
"""

from __future__ import annotations

import importlib

import labkit.grading


def define(source: str, name: str):
    """Run an answer cell's source in a fresh namespace and return the function it defines."""
    namespace: dict = {}
    exec(compile(source, f"<answer {name}>", "exec"), namespace)
    return namespace[name]


def grade(task_id: str, answer) -> str:
    """Call the check exactly as a check cell does; return "PASS" or the failure text."""
    try:
        importlib.reload(labkit.grading).check(task_id, answer)
    except AssertionError as failure:        # CheckFailed (its class is re-created by the reload)
        assert type(failure).__name__ == "CheckFailed"
        return str(failure)
    return "PASS"


TAMPER = {
    "rebinds check to print the pass line": '''
import labkit.grading
labkit.grading.check = lambda task_id, answer: print(f"PASS {task_id}: anything held under every schedule")
''',
    "clears the registered tasks": '''
import labkit.grading
labkit.grading.TASKS.clear()
''',
    "patches expect to do nothing in grading": '''
import labkit.grading
labkit.grading.expect = lambda *args, **kwargs: None
''',
    "patches expect to do nothing, in grading and in every check module": '''
import sys, labkit.grading
labkit.grading.expect = lambda *args, **kwargs: None
for name in labkit.grading.CHECK_MODULES:
    sys.modules[name].expect = lambda *args, **kwargs: None
''',
    "replaces every trial by one that does nothing": '''
import labkit.grading, labkit.grading.checks02, labkit.grading.writers
for t in list(labkit.grading.TASKS.values()):
    labkit.grading.TASKS[t.id] = t.__class__(t.id, t.title, lambda *a: None, t.schedules)
labkit.grading.checks02.fenced_insert_check = lambda *a: None
labkit.grading.writers.fenced_trial = lambda *a, **k: None
''',
}
