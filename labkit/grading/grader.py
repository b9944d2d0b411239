"""Grade a folder of submitted exercise notebooks and print a scorecard.

Usage: ``python -m labkit.grade SUBMISSIONS... [--junit out.xml] [--csv out.csv]
[--feedback DIR] [--points FILE] [--cell-timeout 30] [--solutions solutions/] [--jobs N]
[--only STUDENT] [--unsandboxed] [--seed N]``.

SUBMISSIONS are notebooks or folders searched for ``*.ipynb``. A submission's student is the
first folder under the folder given on the command line (a notebook lying directly in it: its
file name; a notebook given alone: its folder's name), so ``friend/me/02.ipynb`` is the
friend's. Symbolic and hard links, device files, pipes and names with control characters are
refused, each with a line saying why; of two notebooks of one exercise from one student the
first (in path order) readable one is graded, and the other's line names it. Its exercise is the
solution whose check cells carry the same ``task:`` tags (failing that, the one with the same
file name). The canonical check cells are put back (edited or deleted ones count for nothing),
and the notebook's code cells are judged out of process (:mod:`labkit.grading.judge`): they run
in order in a sandboxed worker, and each task's trials run against the answer there. Stored
outputs are never read. A notebook that is not JSON, is over 5 MB, has no task cells, loops,
fork-bombs, fills its disk or exits costs that student only.

Each task's points are shared among its properties (10 a task unless ``--points FILE``, a
JSON object of task -> points, or task -> {property: points}, says otherwise); a property
scores only if some schedule checked it and none broke it. The scorecard, the CSV and the
JUnit file give each task's points, each broken property with its seed and replay call, and
each student's total; ``--feedback DIR`` writes a page per student with the failing timelines.

It fails closed: without a working sandbox (bubblewrap, and a process limit: see
:func:`labkit.grading.sandbox.missing`) it grades nothing, says what is missing and exits 3.
``--unsandboxed`` grades anyway, and every row of every output then says UNSANDBOXED.

The exit status says whether grading ran (0), not whether students passed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import pathlib
import sys

from labkit.errors import BadArgument, LabkitError
from labkit.grading import refused, tasks_loaded
from labkit.grading.intake import Submission, canonical, collect, once, prepare
from labkit.grading.intake import restore_checks, task_of
from labkit.grading.notebooks import ROOT
from labkit.grading.reports import scorecard, totals, write_csv, write_feedback, write_junit

__all__ = ["Submission", "grade", "main", "load_points", "restore_checks", "task_of"]
__all__ += ["scorecard", "totals", "write_csv", "write_feedback", "write_junit"]


#: why a notebook scores nothing when the process that judged it died (a signal, a crash in SQLite)
CRASHED = "the judge crashed on this notebook; look at it by hand"


def notebook_limit(cells: int, tasks: int, timeout: float) -> float:
    """The real time a notebook's judge may take: each cell its ``timeout``, each task the
    judge's task limit, and a little to start; past it the judge is killed."""
    from labkit.grading.judge import TASK_LIMIT

    return timeout * (cells + TASK_LIMIT * tasks + 2)


def _judge(job: tuple) -> dict:
    """Judge one prepared notebook in a process of its own: ``{task: Report}``. If that process
    dies (a signal, a crash inside SQLite) or outlives :func:`notebook_limit`, every task of
    this notebook scores nothing and says so; the other notebooks are not touched."""
    import select
    import signal

    from labkit.clock import RealClock
    from labkit.grading import judge  # noqa: F401 -- loaded once here, not in each notebook's fork
    from labkit.grading.notebooks import cell_source
    from labkit.grading.scores import Report

    nb, tasks = job[:2]
    cells = [
        s
        for c in nb["cells"]
        if c.get("cell_type") == "code" and isinstance(s := cell_source(c), str)
    ]
    limit = notebook_limit(len(cells), len(tasks), job[3])
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the judge: whatever happens here, it ends here
        try:
            os.close(rfd)
            os.setpgid(0, 0)  # its sandbox's processes go with it
            found = {t: r.to_json() for t, r in _judge_here(job, cells).items()}
            data = json.dumps(found).encode()
            while data:
                data = data[os.write(wfd, data) :]
        finally:
            os._exit(0)
    os.close(wfd)
    clock = RealClock()  # grading's real-time bound
    chunks, end, why = [], clock.now() + limit, CRASHED
    try:
        while (left := end - clock.now()) > 0 and select.select([rfd], [], [], left)[0]:
            if not (chunk := os.read(rfd, 1 << 16)):
                break
            chunks.append(chunk)
        else:
            why = f"the judge did not finish this notebook within {limit:g} s; look at it by hand"
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
    finally:
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
    try:
        if status != 0:
            raise ValueError(f"the judge's exit status {status}")
        found = json.loads(b"".join(chunks))
        return {t: Report.from_json(found[t]) for t in tasks}
    except (ValueError, KeyError, TypeError):
        return {t: refused(t, why) for t in tasks}


def _judge_here(job: tuple, cells: list[str]) -> dict:
    """Judge one prepared notebook in this process: ``{task: Report}``."""
    from labkit.grading import judge, lab
    from labkit.grading.notebooks import program

    _, tasks, hide, timeout, solutions, run = job
    os.environ["LABKIT_SOLUTIONS"] = str(solutions)  # the judge reads the keys from there
    lab.SOLUTIONS = str(solutions)
    try:
        verdicts = judge.judge(program(cells), set(tasks), hide=hide, timeout=timeout, run=run)
    except Exception as exc:  # whatever went wrong costs this notebook only, and says so
        verdicts = {t: refused(t, f"the judge could not run it ({exc!r})") for t in tasks}
    return {t: verdicts.get(t) or refused(t, "its check never ran") for t in tasks}


def grade(
    paths: list[str],
    *,
    solutions=ROOT / "solutions",
    cell_timeout: int = 30,
    jobs: int = 1,
    only: str | None = None,
    hide=(),
    progress=sys.stderr,
    unsandboxed: bool = False,
    seed: int | None = None,
) -> list[Submission]:
    """Grade every submission under ``paths`` (only ``only``'s, if given); return them with
    per-task results. ``jobs`` notebooks are judged at once; ``hide`` names more folders the
    answers must not see (the submissions and the solutions are always hidden). Without a
    working sandbox it raises LabkitError, unless ``unsandboxed`` (each Submission says so).
    Each notebook's run draws its seed from the operating system (its Reports record it), or
    every one is seeded ``seed``: that replays a run exactly."""
    from labkit.grading.sandbox import missing

    lacking = missing()
    if lacking and not unsandboxed:
        listed = "\n  ".join(lacking)
        raise LabkitError(
            f"refusing to grade: answers would run without a sandbox:\n  {listed}\n"
            "(--unsandboxed grades anyway, and marks every result UNSANDBOXED)"
        )
    solutions = pathlib.Path(solutions).resolve()
    canon = canonical(solutions)
    subs = [s for s in collect(paths) if only is None or s.student == only]
    for sub in subs:
        sub.unsandboxed = bool(lacking)
    folders = {
        str(
            pathlib.Path(p).resolve().parent
            if pathlib.Path(p).is_file()
            else pathlib.Path(p).resolve()
        )
        for p in paths
    }
    hidden = (*sorted(folders), str(solutions), *map(str, hide))
    work = once([(s, prepare(s, canon)) for s in subs])
    print(f"grading {len(work)} notebooks ...", file=progress, flush=True)
    args = [(nb, list(s.results), hidden, float(cell_timeout), solutions, seed) for s, nb in work]
    pool = None
    if jobs > 1 and len(work) > 1:
        pool = concurrent.futures.ProcessPoolExecutor(
            jobs, mp_context=multiprocessing.get_context("fork")
        )
    try:
        outcomes = pool.map(_judge, args) if pool else map(_judge, args)
        for done, ((sub, _), results) in enumerate(zip(work, outcomes), 1):
            sub.results = results
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


def load_points(path) -> dict:
    """Read a ``--points`` file: ``{task: points}`` or ``{task: {property: points}}``, each
    task and property one that exists, each number at least 0 (BadArgument otherwise)."""
    try:
        given = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BadArgument("--points", f"cannot read {path} as JSON: {exc}") from None
    tasks = tasks_loaded()
    if not isinstance(given, dict):
        raise BadArgument("--points", "must be a JSON object of task -> points")
    for tid, value in given.items():
        if tid not in tasks:
            raise BadArgument(
                "--points", f"there is no task {tid!r}; the tasks are {sorted(tasks)}"
            )
        props = tasks[tid].properties
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for prop, n in items:
            if prop is not None and prop not in props:
                raise BadArgument(
                    "--points", f"task {tid} has no property {prop!r}; it has {list(props)}"
                )
            if isinstance(n, bool) or not isinstance(n, (int, float)) or not 0 <= n < float("inf"):
                raise BadArgument(
                    "--points", f"task {tid}: points must be a number >= 0, got {n!r}"
                )
        if isinstance(value, dict) and set(props) - set(value):  # worth 0: said, not silent
            left = sorted(set(props) - set(value))
            print(f"labkit.grade: --points gives task {tid}'s {left} no points", file=sys.stderr)
    return given


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
    parser.add_argument("--feedback", type=pathlib.Path, help="write a page per student here")
    parser.add_argument("--points", type=pathlib.Path, help="JSON: task -> points")
    parser.add_argument("--unsandboxed", action="store_true", help="grade without a sandbox")
    parser.add_argument("--seed", type=int, help="the run's seed (default: drawn from the OS)")
    args = parser.parse_args(argv)
    try:
        points = load_points(args.points) if args.points else None
    except BadArgument as exc:
        parser.error(str(exc))
    outputs = [p.resolve().parent for p in (args.junit, args.csv) if p]
    outputs += [args.feedback.resolve()] if args.feedback else []
    try:
        subs = grade(
            args.submissions,
            solutions=args.solutions,
            cell_timeout=args.cell_timeout,
            jobs=max(1, args.jobs),
            only=args.only,
            hide=outputs,
            unsandboxed=args.unsandboxed,
            seed=args.seed,
        )
    except LabkitError as exc:
        print(f"labkit.grade: {exc}", file=sys.stderr)
        return 3
    print(scorecard(subs, points))
    if args.junit:
        write_junit(subs, args.junit, points)
    if args.csv:
        write_csv(subs, args.csv, points)
    if args.feedback:
        pages = write_feedback(subs, args.feedback, points, jobs=max(1, args.jobs))
        print(f"{len(pages)} feedback pages in {args.feedback}", file=sys.stderr)
    return 0
