"""How long each grading check takes on a correct answer (target: under 2 s per task).

Each task's check runs every one of its schedules against real SQLite, the
way a check cell does. The answers are the first correct answer of each task
in the test corpus (``tests/corpus_part*.py``). Printed: the task, how many
schedules it ran, and the best and median wall time over ``--repeat`` runs.

Run: ``make bench`` or ``python benchmarks/checks.py [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import labkit.grading  # noqa: E402
import corpus_part1  # noqa: E402
import corpus_part2  # noqa: E402


def answer(task_id: str):
    """Define the task's first correct corpus answer and return the function."""
    entry = {**corpus_part1.CORPUS, **corpus_part2.CORPUS}[task_id]
    namespace: dict = {}
    exec(next(iter(entry["right"].values())), namespace)
    return namespace[entry["name"]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'task':<6} {'schedules':>9} {'best s':>8} {'median s':>9}  under 2 s")
    worst = 0.0
    for task_id, task in sorted(labkit.grading.TASKS.items()):
        fn, times = answer(task_id), []
        for _ in range(args.repeat):
            began = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                labkit.grading.check(task_id, fn)
            times.append(time.perf_counter() - began)
        worst = max(worst, statistics.median(times))
        print(f"{task_id:<6} {len(task.schedules):>9} {min(times):>8.3f} {statistics.median(times):>9.3f}"
              f"  {'yes' if statistics.median(times) < 2 else 'NO'}")
    print(f"slowest median: {worst:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
