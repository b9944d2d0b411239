"""Intake: which notebooks a submissions folder holds, whose they are, and which can be graded.

A student is the first folder under a folder given to the grader (a notebook lying directly in
it: its file name), so ``friend/me/02.ipynb`` is the friend's. Symbolic links (to a notebook or
a folder, never followed), hard links, device files, pipes and names with control characters are
refused, each with its reason; a file is opened once, without following links, and judged by
what that open found. Of two notebooks of one exercise from one student the first readable one
(in path order) is graded and the other refused, naming it. Each notebook gets the solution's
canonical check cells back (:func:`restore_checks`).
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import re
import stat
from dataclasses import dataclass, field

from labkit.grading import refused
from labkit.grading.notebooks import is_check

__all__ = ["Submission", "canonical", "collect", "once", "prepare", "restore_checks", "task_of"]


@dataclass(slots=True)
class Submission:
    """One notebook being graded.

    Attributes: ``path``, ``student``, ``exercise`` (the matching solution's file name, or
    None), ``results`` (task id -> its :class:`~labkit.grading.scores.Report`), ``problem``
    (why the notebook could not be run), ``unsandboxed`` (its answers ran without bubblewrap).
    """

    path: pathlib.Path
    student: str
    exercise: str | None = None
    results: dict = field(default_factory=dict)
    problem: str | None = None
    unsandboxed: bool = False

    @property
    def outcomes(self) -> dict[str, str]:
        """Task id -> "pass" (every property scored) or "fail"."""
        return {t: "pass" if r and r.passed else "fail" for t, r in self.results.items()}

    @property
    def notes(self) -> dict[str, str]:
        """Task id -> that task's scorecard, for the tasks that failed."""
        return {t: r.text() for t, r in self.results.items() if r and not r.passed}

    def refuse(self, why: str) -> None:
        """The notebook could not be run: every task scores nothing, and says why."""
        self.problem = why
        self.results = {t: refused(t, why) for t in self.results}


def task_of(cell) -> str | None:
    """Return the ``task:`` tag's id of a cell, or None."""
    tags = cell.get("metadata", {}).get("tags", [])
    return next((tag[len("task:") :] for tag in tags if tag.startswith("task:")), None)


def canonical(solutions: pathlib.Path) -> dict[str, dict]:
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


#: characters no name may hold: C0/C1 controls, bidirectional overrides, line separators
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _walk(root: pathlib.Path):
    """``(path, why refused or None)`` for every notebook under ``root`` and every link to a
    folder there (never followed), in path order."""
    found = []
    for top, folders, files in os.walk(root):  # links to folders are listed, not entered
        for name in folders + files:
            path = pathlib.Path(top, name)
            if name in folders and path.is_symlink():
                found.append((path, "it is a symbolic link to a folder, which is not followed"))
            elif name in files and name.endswith(".ipynb"):
                found.append((path, None))
        folders[:] = [f for f in folders if f != ".ipynb_checkpoints"]
    return sorted(found)


def collect(paths: list[str]) -> list[Submission]:
    found = []
    for arg in map(pathlib.Path, paths):
        if not arg.is_dir():
            found.append(Submission(arg, arg.resolve().parent.name))
            continue
        for path, why in _walk(arg):
            parts = path.relative_to(arg).parts
            sub = Submission(path, parts[0] if len(parts) > 1 else path.stem)
            bad = next((p for p in parts if CONTROL.search(p)), None)
            sub.problem = why or (bad and f"refused: the name {bad!r} has a control character")
            found.append(sub)
    return found


MAX_BYTES = 5 << 20


def _read(path: pathlib.Path) -> str:
    """The text of a regular file with one name; ValueError says what else it is."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO does not block
    except OSError as exc:
        if path.is_symlink():
            raise ValueError("it is a symbolic link, not a regular file") from None
        raise ValueError(f"it cannot be opened ({exc.strerror})") from None
    with open(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("it is a device file, a pipe or a socket, not a regular file")
        if info.st_nlink > 1:
            raise ValueError(
                f"it is a hard link (one file with {info.st_nlink} names): submit a copy"
            )
        if info.st_size > MAX_BYTES:
            raise ValueError(f"it is over {MAX_BYTES >> 20} MB")
        return f.read(MAX_BYTES + 1).decode()


def prepare(sub: Submission, solutions: dict[str, dict]) -> dict | None:
    """The submission with its canonical check cells, or None (``problem`` says why)."""
    nb, tags = None, set()
    try:
        if not sub.problem:  # else refused by its name or its kind before it was opened
            nb = json.loads(_read(sub.path))
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
    sub.results = {t: None for t in _tasks(solutions[match])}
    if nb is None:
        return sub.refuse(sub.problem)
    if not tags:
        return sub.refuse("not a submission of the exercise: it has no task cells")
    try:
        return restore_checks(nb, solutions[match])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        return sub.refuse(f"not a readable notebook: {type(exc).__name__}: {exc}")


def once(prepared: list[tuple]) -> list[tuple]:
    """The (submission, notebook) pairs to judge: one notebook per student and exercise, the
    first readable one; each other copy is refused, and its line names the one graded."""
    graded: dict = {}
    for sub, nb in sorted(prepared, key=lambda p: (p[1] is None, str(p[0].path))):
        key = (sub.student, sub.exercise)
        if sub.exercise is None or key not in graded:
            graded.setdefault(key, sub)
            continue
        sub.results = {}
        sub.problem = f"refused: a second notebook of {sub.exercise}; graded {graded[key].path}"
    return [
        (s, nb) for s, nb in prepared if nb is not None and graded.get((s.student, s.exercise)) is s
    ]
