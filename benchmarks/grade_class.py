"""Grade a whole class with the sandboxed judge: 100 students x 9 notebooks, two at a time.

Each student's notebooks are copies of the solutions. About a third of the answers are
replaced by a known-wrong answer from the test corpus (``tests/corpus_part*.py``), and every
copy differs in its student's name and in whitespace, so that nothing could be cached
across submissions. In the same run, the same number of "empty" notebooks (only the
canonical check cells, nothing to run before them) is graded the same way: the ratio of the
two is what the answers themselves cost over the grader's fixed cost per notebook.

Printed: notebooks, wall seconds, seconds per notebook for the class and for empty ones,
the ratio, and the share of tasks passed (about two thirds should pass).

Run: ``make bench`` or ``python benchmarks/grade_class.py [--students 100] [--jobs 2]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from labkit.grading import grader, notebooks  # noqa: E402
import corpus_part1  # noqa: E402
import corpus_part2  # noqa: E402

CORPUS = {**corpus_part1.CORPUS, **corpus_part2.CORPUS}
SOLUTIONS = {p.name: json.loads(p.read_text()) for p in sorted((ROOT / "solutions").glob("*.ipynb"))}


def submission(solution: dict, rng: random.Random, wrong_share: float) -> dict:
    """A copy of ``solution`` whose answer cells (the cell before each check) are now and then
    a corpus wrong answer, with whitespace that differs from copy to copy."""
    nb = copy.deepcopy(solution)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for before, cell in zip(code, code[1:]):
        task = grader.task_of(cell)
        if task and rng.random() < wrong_share:
            before["source"] = rng.choice(list(CORPUS[task]["wrong"].values()))[0]
    for cell in code:
        if not notebooks.is_check(cell):
            cell["source"] = "\n" * rng.randint(0, 2) + notebooks.cell_source(cell) + " " * rng.randint(0, 3)
    return nb


def empty(solution: dict) -> dict:
    """Only the canonical check cells: what grading a notebook costs with nothing in it."""
    nb = copy.deepcopy(solution)
    nb["cells"] = [c for c in nb["cells"] if notebooks.is_check(c)]
    return nb


def timed(root: Path, jobs: int) -> tuple[float, list]:
    began = time.perf_counter()
    subs = grader.grade([str(root)], jobs=jobs, progress=open("/dev/null", "w"))
    return time.perf_counter() - began, subs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--wrong", type=float, default=0.35, help="share of wrong answers")
    args = parser.parse_args(argv)
    rng = random.Random(12)
    with tempfile.TemporaryDirectory(prefix="labkit-bench-class-") as tmp:
        klass, blank = Path(tmp) / "class", Path(tmp) / "empty"
        for n in range(args.students):
            for name, solution in SOLUTIONS.items():
                for root, nb in ((klass, submission(solution, rng, args.wrong)), (blank, empty(solution))):
                    folder = root / f"student-{n:03d}-{rng.randrange(10**6):06d}"
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / name).write_text(json.dumps(nb, indent=rng.choice([None, 1, 2])))
        seconds, subs = timed(klass, args.jobs)
        empty_seconds, _ = timed(blank, args.jobs)
    count = len(subs)
    results = [r for s in subs for r in s.results.values()]
    passed = sum(r.passed for r in results) / max(1, len(results))
    scored = sum(r.total()[0] for r in results) / max(1.0, sum(r.total()[1] for r in results))
    per, per_empty = seconds / count, empty_seconds / count
    print(f"class: {count} notebooks ({args.students} students x {len(SOLUTIONS)}), --jobs {args.jobs}")
    print(f"  whole class: {seconds:.1f} s = {seconds / 60:.1f} min (goal: 10 min or less)")
    print(f"  per notebook: {per:.3f} s; empty notebook: {per_empty:.3f} s; ratio {per / per_empty:.2f}")
    print(f"  tasks passed: {passed:.0%} of {len(results)}; points scored: {scored:.0%} of those possible")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
