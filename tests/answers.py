"""Running corpus answers the way a notebook does: in the sandbox, after the exercise's own cells.

``define`` runs an answer cell here, for the tests of a trial's logic (tests/test_grading_part*.py).
``judged`` runs answers as the grader does: the solution's cells before the task's answer cell,
then each answer cell, each judged out of process against the sandboxed worker.
``TAMPER`` holds answer-cell prefixes that tamper with the grader in the answer's process.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib

from labkit.grading import judge, refused, tasks_loaded
from labkit.grading.notebooks import program

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: every attack's score beside its bare answer's, a JSON line each (the suite's summary prints them)
ATTACKS = ROOT / "build" / "attacks.jsonl"


def against_bare(kind: str, how: str, task: str, bare, wrapped) -> None:
    """Note what an attack of the class ``kind`` (the wrapper ``how``) scored on ``task`` beside
    the bare answer: the table the closing note and the suite's summary show."""
    ATTACKS.parent.mkdir(exist_ok=True)
    row = {"kind": kind, "how": how, "task": task, "bare": bare.total()[0], "wrapped": wrapped.total()[0]}
    with open(ATTACKS, "a") as f:  # one short write: the workers' lines do not interleave
        f.write(json.dumps(row) + "\n")


def define(source: str, name: str):
    """Run an answer cell's source in a fresh namespace and return the function it defines."""
    namespace: dict = {}
    exec(compile(source, f"<answer {name}>", "exec"), namespace)
    return namespace[name]


def hostile_only(monkeypatch, task_id: str) -> tuple:
    """Leave out ``task_id``'s random rows, for the in-process ``verdict`` (``monkeypatch``
    undoes it): a known fault must be caught by the rows that tell its story, since a fault
    only some seeds catch passes now and then. ``(all rows, hostile rows)``, as tasks."""
    every = tasks_loaded()[task_id]
    rows = dataclasses.replace(every, draw=lambda run: [s for s in every.draw(run) if s.name != "random"])
    monkeypatch.setitem(tasks_loaded(), task_id, rows)
    return every, rows


@functools.cache
def prefix(task_id: str) -> tuple:
    """The solution's program before the answer cell of ``task_id`` (the check's cell minus one)."""
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        items = program([c["source"] for c in cells if c["cell_type"] == "code"])
        for i, item in enumerate(items):
            if item[0] == "check" and item[1] == task_id:
                return tuple(items[: i - 1])
    raise KeyError(task_id)


def judged(task_id: str, name: str, sources: dict, timeout: float = 10.0, run=None) -> dict:
    """``{label: Report}`` for each answer cell of ``sources``, in one sandbox (a fresh
    one, with the prefix run again, after an answer that broke it), in the run seeded ``run``
    (None: drawn from the operating system)."""
    out, box = {}, None
    try:
        for label, source in sources.items():
            if box is None or box.broken:
                if box is not None:
                    box.close()
                box = judge.Sandbox(timeout=timeout)
                for number, item in enumerate(prefix(task_id)):
                    if item[0] == "code":
                        box.cell(item[1], number)
            try:
                box.cell(source, 1000)
            except judge.Refused as exc:
                out[label] = refused(task_id, f"the answer cell broke the sandbox: {exc}", name)
                continue
            out[label] = judge.attempt(box, task_id, name, run=run)
    finally:
        if box is not None:
            box.close()
    return out


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
import labkit.grading, labkit.grading.checks02, labkit.grading.fenced
for t in list(labkit.grading.TASKS.values()):
    labkit.grading.TASKS[t.id] = t.__class__(t.id, t.title, lambda *a: None, t.schedules)
labkit.grading.checks02.fenced_insert_check = lambda *a: None
labkit.grading.fenced.fenced_trial = lambda *a, **k: None
''',
}


def verdict_of(report) -> tuple[bool, str]:
    """``(passed, its text)`` of a Report: what the check cell shows."""
    return report.passed, report.text()
