"""How long a check cell takes on a correct answer, the judge's process included (target: 1 s).

A check cell hands the kernel's cells to a judge (:mod:`labkit.grading.judge`), which runs them
in its sandboxed worker and every schedule of the task against the answer. The judge a check
uses was started ahead (``--ready``: when the notebook imported the grader, or after the last
check), so the student waits for the cells and the schedules only: ``ready`` times exactly
that, from handing over the cells to the Report, once the judge has said it is ready. Beside
it, in the same run: ``cold``, a judge started at the check (``python -m labkit.grading.judge
TASK``, as before), and ``empty``, a cold judge given no cells (the interpreter, the imports
and the checks loading, but no sandbox: less than a ready judge saves, which is cold - ready). Each is the median of ``--repeat`` runs, with the solution's cells up to the
task's check cell.

Run: ``make bench`` or ``python benchmarks/checks.py [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import labkit.grading  # noqa: E402
from labkit.grading.scores import Report  # noqa: E402


def cells_up_to(task_id: str) -> list[str]:
    """The solution's code cells up to and including the check cell of ``task_id``."""
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        code = [c["source"] for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        for i, source in enumerate(code):
            if source.startswith("# NBVAL_CHECK_OUTPUT") and f'check("{task_id}"' in source:
                return code[: i + 1]
    raise KeyError(task_id)


def judged(task_id: str, cells: list[str]) -> float:
    began = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "labkit.grading.judge", task_id],
                         input=json.dumps(cells), capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - began
    if cells and not Report.from_json(json.loads(out.stdout.splitlines()[-1])).passed:
        raise SystemExit(f"task {task_id}: the solution did not pass: {out.stdout}")
    return seconds


def ready(task_id: str, cells: list[str]) -> float:
    """Seconds from handing a ready judge the cells to its Report."""
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with subprocess.Popen([sys.executable, "-m", "labkit.grading.judge", "--ready"], **pipes) as judge:
        if judge.stdout.readline() != "ready\n":
            raise SystemExit(f"the judge did not start: {judge.stderr.read()}")
        began = time.perf_counter()
        out, err = judge.communicate(json.dumps({"argv": [task_id], "cells": cells}))
        seconds = time.perf_counter() - began
    if not Report.from_json(json.loads(out.splitlines()[-1])).passed:
        raise SystemExit(f"task {task_id}: the solution did not pass: {out}{err}")
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'task':<6} {'schedules':>9} {'ready s':>8} {'cold s':>8} {'empty s':>8}  ready under 1 s")
    medians = {"ready": [], "cold": []}
    for task_id, task in sorted(labkit.grading.TASKS.items()):
        cells = cells_up_to(task_id)
        times = {"ready": [], "cold": [], "empty": []}
        for _ in range(args.repeat):
            times["ready"].append(ready(task_id, cells))
            times["cold"].append(judged(task_id, cells))
            times["empty"].append(judged(task_id, []))
        m = {kind: statistics.median(seconds) for kind, seconds in times.items()}
        medians["ready"].append(m["ready"])
        medians["cold"].append(m["cold"])
        print(f"{task_id:<6} {len(task.schedules):>9} {m['ready']:>8.3f} {m['cold']:>8.3f} "
              f"{m['empty']:>8.3f}  {'yes' if m['ready'] <= 1 else 'NO'}")
    for kind, found in medians.items():
        print(f"{kind}: slowest task median {max(found):.3f} s, median over tasks "
              f"{statistics.median(found):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
