"""Is a wrong answer caught, and a right one passed, by design or by luck? (goal: 0 misses).

Each grading run draws its seed from the operating system, and so does every ``make test``
run of the grade corpus. A wrong answer that only some seeds catch therefore passes now and
then, in a student's grade and in CI (a 05.2 holder once scored 10/10). This grades every
known-wrong answer of the test corpus, and every right one, under ``--seeds`` fresh seeds,
in-process (the sandbox is not what is measured here), with the corpus test's own conditions,
and prints, per answer that was missed, how often and under which seeds, so that
``replay(task, seed=...)`` shows the run. It exits non-zero if any seed missed any answer.
Each answer is graded twice per seed: with every row, and with the hostile rows alone (the
random ones left out, as ``test_every_known_wrong_answer_is_caught_by_the_hostile_rows_alone``
does), where a wrong answer is missed if it keeps a property the corpus says it breaks.

Run: ``make bench`` or ``python benchmarks/luck.py [--seeds 10] [--only 05.2] [--rows hostile]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import multiprocessing
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import corpus_part1  # noqa: E402
import corpus_part2  # noqa: E402
from answers import define, hostile_only  # noqa: E402
from labkit.grading import verdicts  # noqa: E402

CORPUS = {**corpus_part1.CORPUS, **corpus_part2.CORPUS}


def misses(task_id: str, label: str, seeds: int, hostile: bool = False) -> list[int]:
    """The seeds, of ``seeds`` drawn ones, under which the corpus test would fail: ``label`` lost
    points for other properties than those the corpus says it breaks (or, for an answer that
    scores nothing, scored something), or a right answer failed."""
    entry = CORPUS[task_id]
    right = label in entry["right"]
    source, phrase, named = (entry["right"][label], "", None) if right else entry["wrong"][label]
    answer = define(source, entry["name"])
    want = set(named) if isinstance(named, tuple) else {named} - {None}

    @contextlib.contextmanager
    def answers():
        yield answer

    missed = []
    with pytest.MonkeyPatch.context() as patch:  # undone after: this pool process grades other cases next
        if hostile:
            hostile_only(patch, task_id)
        for _ in range(seeds):
            report = verdicts.verdict(task_id, answers, label, run=verdicts.draw_seed())
            lost = {f.prop for f in report.findings if not f.scored}  # as the corpus test reads it
            if right:
                miss = not report.passed
            elif hostile:  # the hostile-rows test's assertion
                got = {f.prop for f in report.findings if f.broken} | ({report.problem.prop} if report.problem else set())
                miss = not want <= got or (not want and report.total()[0] > 0)
            else:  # the corpus test's assertions, one for one
                miss = report.passed or phrase not in report.text()
                if not want:  # a constant scores nothing
                    miss = miss or report.total()[0] > 0
                else:
                    broken = {f.prop for f in report.findings if f.broken}
                    miss = miss or report.problem is not None or lost != want or not want <= broken
            if miss:
                missed.append(report.run)
    return missed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="fresh seeds per answer")
    parser.add_argument("--only", action="append", help="only this task (repeatable)")
    parser.add_argument("--rows", choices=("all", "hostile", "both"), default="both")
    args, _ = parser.parse_known_args(argv)
    tasks = [t for t in sorted(CORPUS) if not args.only or t in args.only]
    modes = {"all": [False], "hostile": [True], "both": [False, True]}[args.rows]
    cases = [(t, label, args.seeds, hostile) for hostile in modes for t in tasks
             for label in [*CORPUS[t]["right"], *CORPUS[t]["wrong"]]]
    began = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(
        2, mp_context=multiprocessing.get_context("fork")
    ) as pool:
        found = list(pool.map(misses, *zip(*cases)))
    missed = [(case, m) for case, m in zip(cases, found) if m]
    for (task_id, label, _, hostile), runs in missed:
        rows = "hostile rows" if hostile else "every row"
        print(f"  MISSED {task_id} {label!r} ({rows}): {len(runs)}/{args.seeds} seeds, e.g. {runs[:3]}")
    print(
        f"{len(cases)} gradings of an answer (right and wrong, rows: {args.rows}) x {args.seeds} seeds: "
        f"{sum(map(len, found))} misses "
        f"({len(missed)} answers) in {time.perf_counter() - began:.1f} s"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
