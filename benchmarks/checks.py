"""How long a check cell takes on a correct answer, the judge's process included (target: 2 s).

A check cell hands the kernel's cells to ``python -m labkit.grading.judge TASK``, which starts
the sandboxed worker, runs the cells there and every schedule of the task against the answer.
This runs exactly that command for each task, with the solution's cells up to its check cell,
and prints the task, its schedules, and the best and median wall time over ``--repeat`` runs;
beside it, the same command for an empty program (the judge's fixed cost), in the same run.

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'task':<6} {'schedules':>9} {'best s':>8} {'median s':>9}  {'empty s':>8}  under 2 s")
    worst = 0.0
    for task_id, task in sorted(labkit.grading.TASKS.items()):
        cells = cells_up_to(task_id)
        times, blank = [], []
        for _ in range(args.repeat):
            times.append(judged(task_id, cells))
            blank.append(judged(task_id, []))
        median = statistics.median(times)
        worst = max(worst, median)
        print(f"{task_id:<6} {len(task.schedules):>9} {min(times):>8.3f} {median:>9.3f}  "
              f"{statistics.median(blank):>8.3f}  {'yes' if median <= 2 else 'NO'}")
    print(f"slowest median: {worst:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
