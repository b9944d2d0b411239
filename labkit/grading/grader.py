"""Grade a folder of submitted exercise notebooks and print a scorecard.

Usage: ``python -m labkit.grade SUBMISSIONS... [--junit out.xml] [--csv out.csv]
[--cell-timeout 30] [--solutions solutions/] [--jobs N] [--only STUDENT]``.

SUBMISSIONS are notebooks or folders searched for ``*.ipynb``. A submission's
student is the name of its folder (or, lying directly in a folder given on the
command line, its file name); its exercise is the solution whose check cells carry
the same ``task:`` tags (failing that, the one with the same file name). The
canonical check cells are put back (edited or deleted ones count for nothing), and
the notebook's code cells are judged out of process (:mod:`labkit.grading.judge`):
they run in order in a sandboxed worker, and each task's trials run against the answer
there. Stored outputs are never read. A notebook that is not JSON, is over 5 MB, has
no task cells, loops, fork-bombs, fills its disk or exits costs that student only.

The exit status says whether grading ran (0), not whether students passed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import csv
import json
import multiprocessing
import os
import pathlib
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from labkit.grading.notebooks import ROOT, is_check

__all__ = ["Submission", "grade", "main"]


@dataclass(slots=True)
class Submission:
    """One notebook being graded.

    Attributes: ``path``, ``student``, ``exercise`` (the matching solution's file name, or
    None), ``results`` (task id -> "pass" / "fail"), ``problem`` (why the notebook could not be
    run), ``notes`` (task id -> why that task failed).
    """

    path: pathlib.Path
    student: str
    exercise: str | None = None
    results: dict = field(default_factory=dict)
    problem: str | None = None
    notes: dict = field(default_factory=dict)


def task_of(cell) -> str | None:
    """Return the ``task:`` tag's id of a cell, or None."""
    tags = cell.get("metadata", {}).get("tags", [])
    return next((tag[len("task:") :] for tag in tags if tag.startswith("task:")), None)


def _canonical(solutions: pathlib.Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(solutions.glob("*.ipynb"))}


def _tasks(nb: dict) -> list[str]:
    return [t for t in map(task_of, nb["cells"]) if t]


def restore_checks(submitted: dict, solution: dict) -> dict:
    """Return ``submitted`` with every check cell replaced by the solution's canonical one."""
    canon = {task_of(c): c for c in solution["cells"] if task_of(c)}
    nb, seen, cells = copy.deepcopy(submitted), set(), []
    for cell in nb["cells"]:
        tid = task_of(cell)
        if tid in canon:
            cells.append(copy.deepcopy(canon[tid]))
            seen.add(tid)
        elif not is_check(cell):  # a check cell that is not canonical is dropped
            cells.append(cell)
    cells += [copy.deepcopy(canon[t]) for t in canon if t not in seen]
    nb["cells"] = cells
    return nb


def _collect(paths: list[str]) -> list[Submission]:
    found = []
    for arg in map(pathlib.Path, paths):
        files = sorted(arg.rglob("*.ipynb")) if arg.is_dir() else [arg]
        files = [f for f in files if ".ipynb_checkpoints" not in f.parts]
        found += [Submission(f, f.stem if f.parent == arg else f.parent.name) for f in files]
    return found


MAX_BYTES = 5 << 20


def _prepare(sub: Submission, solutions: dict[str, dict]) -> dict | None:
    """The submission with its canonical check cells, or None (``problem`` says why)."""
    nb, tags = None, set()
    try:
        if sub.path.is_symlink() or not sub.path.is_file():  # a link to a solution, a FIFO
            raise ValueError("it is not a regular file")
        if sub.path.stat().st_size > MAX_BYTES:
            raise ValueError(f"it is over {MAX_BYTES >> 20} MB")
        nb = json.loads(sub.path.read_text())
        tags = set(_tasks(nb))
        if not isinstance(nb["cells"], list):
            raise ValueError("its cells are not a list")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        sub.problem, nb = f"not a readable notebook: {exc}", None
    match = next((n for n, s in solutions.items() if tags and tags & set(_tasks(s))), None)
    match = match or next((n for n in solutions if sub.path.name.endswith(n)), None)
    sub.exercise = match
    if match is None:
        sub.problem = sub.problem or "matches no exercise in solutions/ (it has no task cells)"
        return None
    sub.results = {t: "fail" for t in _tasks(solutions[match])}
    if nb is None:
        return None
    if not tags:
        sub.problem = "not a submission of the exercise: it has no task cells"
        return None
    try:
        return restore_checks(nb, solutions[match])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        sub.problem = f"not a readable notebook: {type(exc).__name__}: {exc}"
        return None


def _judge(job: tuple) -> tuple[dict, dict]:
    """Judge one prepared notebook: ``({task: "pass" | "fail"}, {task: why, when it failed})``."""
    from labkit.grading import judge
    from labkit.grading.notebooks import cell_source, program

    nb, tasks, hide, timeout, solutions = job
    os.environ["LABKIT_SOLUTIONS"] = str(solutions)  # the judge reads the keys from there
    import labkit.grading

    labkit.grading.SOLUTIONS = str(solutions)
    try:
        sources = [cell_source(c) for c in nb["cells"] if c.get("cell_type") == "code"]
        items = program([s for s in sources if isinstance(s, str)])
        verdicts = judge.judge(items, set(tasks), hide=hide, timeout=timeout)
    except Exception as exc:  # whatever went wrong costs this notebook only, and says so
        verdicts = {t: (False, f"task {t}: the judge could not run it ({exc!r})") for t in tasks}
    results = {t: "pass" if verdicts.get(t, (False,))[0] else "fail" for t in tasks}
    notes = {t: verdicts[t][1] for t in tasks if results[t] == "fail" and t in verdicts}
    return results, notes


def grade(
    paths: list[str],
    *,
    solutions=ROOT / "solutions",
    cell_timeout: int = 30,
    jobs: int = 1,
    only: str | None = None,
    hide=(),
    progress=sys.stderr,
) -> list[Submission]:
    """Grade every submission under ``paths`` (only ``only``'s, if given); return them with
    per-task results. ``jobs`` notebooks are judged at once; ``hide`` names more folders the
    answers must not see (the submissions and the solutions are always hidden)."""
    solutions = pathlib.Path(solutions).resolve()
    canon = _canonical(solutions)
    subs = [s for s in _collect(paths) if only is None or s.student == only]
    folders = {
        str(
            pathlib.Path(p).resolve().parent
            if pathlib.Path(p).is_file()
            else pathlib.Path(p).resolve()
        )
        for p in paths
    }
    hidden = (*sorted(folders), str(solutions), *map(str, hide))
    work = [(s, nb) for s in subs if (nb := _prepare(s, canon)) is not None]
    print(f"grading {len(work)} notebooks ...", file=progress, flush=True)
    args = [(nb, list(s.results), hidden, float(cell_timeout), solutions) for s, nb in work]
    pool = None
    if jobs > 1 and len(work) > 1:
        pool = concurrent.futures.ProcessPoolExecutor(
            jobs, mp_context=multiprocessing.get_context("fork")
        )
    try:
        outcomes = pool.map(_judge, args) if pool else map(_judge, args)
        for done, ((sub, _), (results, notes)) in enumerate(zip(work, outcomes), 1):
            sub.results, sub.notes = results, notes
            bar = "#" * (30 * done // len(work))
            print(
                f"\r[{bar:<30}] {done}/{len(work)} {sub.student}", end="", file=progress, flush=True
            )
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
    if work:
        print(file=progress)
    return subs


def _why(s: Submission, tid: str) -> str:
    """What to say of one failed task: its own note, else the notebook's problem."""
    return s.notes.get(tid) or s.problem or f"task {tid} failed its check"


def totals(subs: list[Submission]) -> dict[str, int]:
    """Tasks passed per student, over all of their notebooks."""
    out: dict[str, int] = {}
    for s in subs:
        out[s.student] = out.get(s.student, 0) + sum(v == "pass" for v in s.results.values())
    return out


def scorecard(subs: list[Submission]) -> str:
    """Return the scorecard: a row per notebook, a column per task, the student's total."""
    tasks, total = sorted({t for s in subs for t in s.results}), totals(subs)
    width = max([len("student")] + [len(s.student) for s in subs])
    head = "student".ljust(width) + "  " + "  ".join(t.ljust(5) for t in tasks)
    lines = [head + "  total  notebook"]
    for s in subs:
        cells = "  ".join(s.results.get(t, "-").ljust(5) for t in tasks)
        note = (s.exercise or s.path.name) + (f"  ({s.problem})" if s.problem else "")
        lines.append(f"{s.student.ljust(width)}  {cells}  {total[s.student]:<5}  {note}")
    return "\n".join(lines)


def write_junit(subs: list[Submission], path: pathlib.Path) -> None:
    """Write one testcase per (notebook, task), failed or passed; a failure says why that task."""
    suite = ET.Element("testsuite", name="labkit-grade")
    for s in subs:
        for tid, outcome in s.results.items():
            where = f"{s.student}.{s.exercise}"
            case = ET.SubElement(suite, "testcase", classname=where, name=f"task {tid}")
            if outcome != "pass":
                ET.SubElement(case, "failure", message=_why(s, tid).split("\n")[0]).text = _why(
                    s, tid
                )
        if not s.results:
            case = ET.SubElement(suite, "testcase", classname=s.student, name=s.path.name)
            ET.SubElement(case, "failure", message=s.problem or "not graded")
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(sum(1 for c in suite if len(c))))
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)


def write_csv(subs: list[Submission], path: pathlib.Path) -> None:
    """Write student, notebook, task, outcome, problem (that task's), and the student's total."""
    total = totals(subs)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["student", "notebook", "task", "outcome", "problem", "total"])
        for s in subs:
            for tid, outcome in s.results.items():
                why = "" if outcome == "pass" else _why(s, tid).split("\n")[0]
                out.writerow([s.student, s.exercise, tid, outcome, why, total[s.student]])


def main(argv: list[str] | None = None) -> int:
    first_line = __doc__.split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m labkit.grade", description=first_line)
    parser.add_argument("submissions", nargs="+")
    parser.add_argument("--junit", type=pathlib.Path)
    parser.add_argument("--csv", type=pathlib.Path)
    parser.add_argument("--cell-timeout", type=int, default=30)
    parser.add_argument("--solutions", type=pathlib.Path, default=ROOT / "solutions")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks judged at once")
    parser.add_argument("--only", help="grade only this student")
    args = parser.parse_args(argv)
    outputs = [p.resolve().parent for p in (args.junit, args.csv) if p]
    subs = grade(
        args.submissions, solutions=args.solutions, cell_timeout=args.cell_timeout,
        jobs=max(1, args.jobs), only=args.only, hide=outputs,
    )  # fmt: skip
    print(scorecard(subs))
    if args.junit:
        write_junit(subs, args.junit)
    if args.csv:
        write_csv(subs, args.csv)
    return 0
