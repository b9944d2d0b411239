"""The course under nbval against its floor: the lessons and solutions, then as many empty notebooks.

``make test`` runs every lesson and solution under nbval (``pytest --nbval-lax
--nbval-current-env -n 2 --dist loadfile``). The floor is what nbval costs with nothing to run: the same
number of notebooks, each one code cell (``pass``), in a temporary folder, in the same way.
The two are run in turns (``--rounds`` of each, course first, then the floor) so that machine
noise lands on both; printed: each round's seconds, the median of each, and their ratio
(target: 2.0 or less). A run that fails is reported and the script exits 1.

Run: ``make bench`` or ``python benchmarks/nbval_floor.py [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBVAL = ["-p", "no:hypothesispytest", "--nbval-lax", "--nbval-current-env", "-n", "2", "--dist", "loadfile", "-q"]


def course() -> list[Path]:
    """What ``make test``'s nbval step collects: every notebook below notebooks/ and solutions/."""
    return sorted((ROOT / "notebooks").rglob("*.ipynb")) + sorted((ROOT / "solutions").rglob("*.ipynb"))


def empty_notebooks(folder: Path, count: int) -> list[Path]:
    """``count`` notebooks of one code cell each, written under ``folder``."""
    cell = {"cell_type": "code", "source": "pass", "metadata": {}, "outputs": [], "execution_count": None}
    nb = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    paths = [folder / f"empty{i:02d}.ipynb" for i in range(count)]
    for path in paths:
        path.write_text(json.dumps(nb))
    return paths


def timed(paths: list[Path], cwd: Path) -> tuple[float, int]:
    """Seconds for one nbval run over ``paths``, and pytest's exit status."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", *NBVAL, *map(str, paths)], cwd=cwd,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - began, done.returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args, _ = parser.parse_known_args(argv)  # make bench passes every benchmark the same flags
    notebooks = course()
    times: dict[str, list[float]] = {"course": [], "floor": []}
    failed = False
    with tempfile.TemporaryDirectory() as scratch:
        empties = empty_notebooks(Path(scratch), len(notebooks))
        for round_ in range(1, args.rounds + 1):
            seconds, status = timed(notebooks, ROOT)
            failed |= status != 0
            times["course"].append(seconds)
            floor, status = timed(empties, Path(scratch))
            failed |= status != 0
            times["floor"].append(floor)
            print(f"round {round_}: course {seconds:.1f} s{' (FAILED)' * (status != 0)}, "
                  f"floor {floor:.1f} s", flush=True)
    course_s, floor_s = (statistics.median(times[k]) for k in ("course", "floor"))
    print(f"{len(notebooks)} notebooks: course {course_s:.1f} s, floor {floor_s:.1f} s, "
          f"ratio {course_s / floor_s:.2f} (target 2.0 or less)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
