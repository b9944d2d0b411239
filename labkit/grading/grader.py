"""Grade a folder of submitted exercise notebooks with nbval and print a scorecard.

Usage: ``python -m labkit.grade SUBMISSIONS... [--junit out.xml] [--csv out.csv]
[--cell-timeout 30] [--solutions solutions/]``.

SUBMISSIONS are notebooks or folders searched for ``*.ipynb``. A submission's
student is the name of its folder (or, lying directly in a folder given on the
command line, its file name); its exercise is the solution whose check cells carry
the same ``task:`` tags (failing that, the one with the same file name). The
canonical check cells are put back (edited or deleted ones count for nothing), and
each notebook runs in its own temporary folder under ``pytest --nbval-lax`` with a
per-cell timeout. A task passes only if its check cell passed (after a timeout
nbval xfails the later cells: they fail here) and passes again outside the
student's kernel (:mod:`labkit.grading.verify`). A notebook that is not valid
JSON, crashes its kernel or loops forever costs that student only.

The exit status says whether grading ran (0), not whether students passed.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import pathlib
import secrets
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from labkit.grading.notebooks import ROOT, is_check

__all__ = ["Submission", "grade", "main"]


@dataclass(slots=True)
class Submission:
    """One notebook being graded.

    Attributes: ``path``, ``student``, ``exercise`` (the matching solution's file name, or
    None), ``results`` (task id -> "pass" / "fail"), ``problem`` (why it could not be run).
    """

    path: pathlib.Path
    student: str
    exercise: str | None = None
    results: dict = field(default_factory=dict)
    problem: str | None = None


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


def _prepare(
    sub: Submission, solutions: dict[str, dict], workdir: pathlib.Path
) -> pathlib.Path | None:
    try:
        nb = json.loads(sub.path.read_text())
        tags = set(_tasks(nb))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sub.problem, nb, tags = f"not a readable notebook: {exc}", None, set()
    match = next((n for n, s in solutions.items() if tags and tags & set(_tasks(s))), None)
    match = match or next((n for n in solutions if sub.path.name.endswith(n)), None)
    sub.exercise = match
    if match is None:
        sub.problem = sub.problem or "matches no exercise in solutions/"
        return None
    sub.results = {t: "fail" for t in _tasks(solutions[match])}
    if nb is None:
        return None
    folder = workdir / f"{len(list(workdir.iterdir())):03d}"
    folder.mkdir()
    target = folder / match
    target.write_text(json.dumps(restore_checks(nb, solutions[match])))
    return target


def _run_nbval(notebooks: list[pathlib.Path], cell_timeout: int, report: pathlib.Path) -> None:
    flags = "-q -p no:cacheprovider -p no:hypothesispytest --nbval-lax --nbval-current-env"
    cmd = [sys.executable, "-m", "pytest", *flags.split(), f"--nbval-cell-timeout={cell_timeout}"]
    cmd += [f"--junitxml={report}", "--rootdir", str(report.parent)]
    cmd += [str(n.relative_to(report.parent)) for n in notebooks]
    limit = 60 + len(notebooks) * 60 + cell_timeout * 4
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    try:
        subprocess.run(cmd, cwd=report.parent, timeout=limit, check=False, **quiet)
    except subprocess.TimeoutExpired:
        pass  # whatever the report holds is what passed; the rest fails


def _passed_cells(report: pathlib.Path, root: pathlib.Path) -> dict[str, set[int]]:
    """Notebook path (relative to ``root``) -> numbers of the code cells that passed."""
    passed: dict[str, set[int]] = {}
    timed_out: dict[str, int] = {}
    if not report.exists():
        return passed
    for case in ET.parse(report).getroot().iter("testcase"):
        name, where = case.get("name", ""), case.get("classname", "")
        if not name.startswith("Cell "):
            continue
        number, entry = int(name.split()[1]), passed.setdefault(where, set())
        if not len(case):  # a failure, error, skip or xfail child means: not a pass
            entry.add(number)
        elif any("Timeout" in (child.get("message") or "") for child in case):
            timed_out[where] = min(number, timed_out.get(where, number))
    for where, first in timed_out.items():  # nbval xfails/xpasses what follows a timeout
        passed[where] = {n for n in passed[where] if n < first}
    return passed


def _key(target: pathlib.Path, root: pathlib.Path) -> str:
    return ".".join(target.relative_to(root).parts)


def _score(sub: Submission, target: pathlib.Path, ok: set[int]) -> None:
    cells = [c for c in json.loads(target.read_text())["cells"] if c["cell_type"] == "code"]
    for number, cell in enumerate(cells):
        tid = task_of(cell)
        if tid in sub.results:
            sub.results[tid] = "pass" if number in ok else "fail"


def grade(
    paths: list[str], *, solutions=ROOT / "solutions", cell_timeout: int = 30, progress=sys.stderr
) -> list[Submission]:
    """Grade every submission under ``paths``; return them with per-task results.

    All notebooks run in one pytest process (one kernel each); a notebook the
    batch could not report on is run again alone, so one bad notebook costs
    only its own student.
    """
    canon = _canonical(solutions)
    subs = _collect(paths)
    with tempfile.TemporaryDirectory(prefix="labkit-grade-") as tmp:
        root = pathlib.Path(tmp)
        (root / "work").mkdir()
        jobs = [(s, t) for s in subs if (t := _prepare(s, canon, root / "work")) is not None]
        print(f"grading {len(jobs)} notebooks ...", file=progress, flush=True)
        passed = {}
        if jobs:
            _run_nbval([t for _, t in jobs], cell_timeout, root / "report.xml")
            passed = _passed_cells(root / "report.xml", root)
        for done, (sub, target) in enumerate(jobs, 1):
            if _key(target, root) not in passed:  # the batch said nothing of it: alone, once
                report = root / f"alone-{done}.xml"
                _run_nbval([target], cell_timeout, report)
                passed.update(_passed_cells(report, root))
            if _key(target, root) not in passed:
                sub.problem = "the notebook could not be run (kernel crash or timeout)"
            _score(sub, target, passed.get(_key(target, root), set()))
            _verify(sub, target, cell_timeout)
            bar = "#" * (30 * done // len(jobs))
            line = f"\r[{bar:<30}] {done}/{len(jobs)} {sub.student}"
            print(line, end="", file=progress, flush=True)
        if jobs:
            print(file=progress)
    return subs


def _verify(sub: Submission, target: pathlib.Path, cell_timeout: int) -> None:
    """Re-check outside the student's kernel every task that passed under nbval."""
    passed = [t for t, outcome in sub.results.items() if outcome == "pass"]
    if not passed:
        return
    nonce = secrets.token_hex(16)
    cells = len(json.loads(target.read_text())["cells"])
    try:
        out = subprocess.run(
            [sys.executable, "-m", "labkit.grading.verify", str(target)],
            cwd=target.parent,
            capture_output=True,
            text=True,
            timeout=60 + cell_timeout * cells,
            env={**os.environ, "LABKIT_VERIFY_NONCE": nonce, "MPLBACKEND": "Agg"},
        )
        line = next((l for l in out.stdout.splitlines() if l.startswith(nonce)), None)
        verdicts = json.loads(line[len(nonce) :]) if line else {}
    except subprocess.TimeoutExpired:
        verdicts = {}
    for task in passed:
        verdict = verdicts.get(task, "fail: the re-check outside the notebook gave no answer")
        if verdict != "pass":
            sub.results[task] = "fail"
            sub.problem = (
                f"task {task} passed in the notebook but not when re-checked outside it ({verdict})"
            )


def scorecard(subs: list[Submission]) -> str:
    """Return the scorecard: a row per student, a column per task."""
    tasks = sorted({t for s in subs for t in s.results})
    width = max([len("student")] + [len(s.student) for s in subs])
    lines = ["student".ljust(width) + "  " + "  ".join(t.ljust(5) for t in tasks) + "  notebook"]
    for s in subs:
        cells = "  ".join(s.results.get(t, "-").ljust(5) for t in tasks)
        note = (s.exercise or s.path.name) + (f"  ({s.problem})" if s.problem else "")
        lines.append(f"{s.student.ljust(width)}  {cells}  {note}")
    return "\n".join(lines)


def write_junit(subs: list[Submission], path: pathlib.Path) -> None:
    """Write one testcase per (notebook, task), failed or passed."""
    suite = ET.Element("testsuite", name="labkit-grade")
    for s in subs:
        for tid, outcome in s.results.items():
            where = f"{s.student}.{s.exercise}"
            case = ET.SubElement(suite, "testcase", classname=where, name=f"task {tid}")
            if outcome != "pass":
                ET.SubElement(case, "failure", message=s.problem or f"task {tid} failed its check")
        if not s.results:
            case = ET.SubElement(suite, "testcase", classname=s.student, name=s.path.name)
            ET.SubElement(case, "failure", message=s.problem or "not graded")
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(sum(1 for c in suite if len(c))))
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)


def write_csv(subs: list[Submission], path: pathlib.Path) -> None:
    """Write student, notebook, task, outcome rows."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["student", "notebook", "task", "outcome", "problem"])
        for s in subs:
            for tid, outcome in s.results.items():
                out.writerow([s.student, s.exercise, tid, outcome, s.problem or ""])


def main(argv: list[str] | None = None) -> int:
    first_line = __doc__.split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m labkit.grade", description=first_line)
    parser.add_argument("submissions", nargs="+")
    parser.add_argument("--junit", type=pathlib.Path)
    parser.add_argument("--csv", type=pathlib.Path)
    parser.add_argument("--cell-timeout", type=int, default=30)
    parser.add_argument("--solutions", type=pathlib.Path, default=ROOT / "solutions")
    args = parser.parse_args(argv)
    subs = grade(args.submissions, solutions=args.solutions, cell_timeout=args.cell_timeout)
    print(scorecard(subs))
    if args.junit:
        write_junit(subs, args.junit)
    if args.csv:
        write_csv(subs, args.csv)
    return 0
