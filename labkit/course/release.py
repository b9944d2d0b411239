"""A student release: a folder, and a zip of it, that a student can use alone.

``python -m labkit.release OUT`` (or ``make release``) writes ``OUT/`` and ``OUT.zip`` with the
lessons (``notebooks/``, without ``notebooks/instructor/``), the exercises generated afresh from
``solutions/``, the ``labkit`` package, ``pyproject.toml``, a Makefile whose ``make lab`` is the
course's and whose ``make test`` runs the exercises' check cells, and the README's part for
students (its two commands and the course; the graders' part stays behind). Nothing of
``solutions/``, the answer keys or ``tests/`` goes in; check cells keep no stored output (a
full-points scorecard), and a quiz's check cell (a task with a key) says that the grader scores
it, since the key is not there. The standard library's ``shutil`` and ``zipfile`` do the
copying: nbgrader's "release" step assumes its own course database and exchange folder.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil

from labkit.errors import BadArgument
from labkit.grading.notebooks import ROOT, exercise_from_solution, is_check

__all__ = ["release", "main", "QUIZ_SAYS"]

QUIZ_SAYS = (
    "task {task} is a quiz: the grader scores it with the answer key, which this copy of the "
    "course does not hold. Hand in the notebook as it is."
)
#: the Makefile's targets a student's copy has no use for (they need solutions/, tests/, benchmarks/)
DROPPED = ("test", "exercises", "bench", "release")
STUDENT_TEST = """test: $(STAMP)
\t$(BIN)/python -m pytest -q -p no:hypothesispytest --nbval-lax --nbval-current-env exercises
"""
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")


def _task(cell) -> str | None:
    tags = cell.get("metadata", {}).get("tags", [])
    return next((t[len("task:") :] for t in tags if t.startswith("task:")), None)


def exercise(solution: dict, quizzes) -> dict:
    """The student's exercise of ``solution``: generated, check cells without stored output, and
    each quiz's check cell (a task of ``quizzes``) printing :data:`QUIZ_SAYS` instead."""
    nb = exercise_from_solution(solution)
    for cell in nb["cells"]:
        if is_check(cell):
            cell["outputs"], cell["execution_count"] = [], None
            task = _task(cell)
            if task in quizzes:
                cell["source"] = f"# NBVAL_CHECK_OUTPUT\nprint({QUIZ_SAYS.format(task=task)!r})"
    return nb


def makefile(text: str) -> str:
    """The course's Makefile without the targets in :data:`DROPPED` (each with the comment above
    it), with the student's ``test``."""
    kept = []
    for part in text.strip().split("\n\n"):
        rule = next((line for line in part.splitlines() if not line.startswith("#")), "")
        target = re.match(r"^([\w.-]+):", rule)
        if not (target and target.group(1) in DROPPED):
            kept.append(part)
    return "\n\n".join([*kept, STUDENT_TEST])


def readme(text: str) -> str:
    """The README's part for students: everything before its graders' section."""
    head = text.split("\n## For graders", 1)[0].rstrip() + "\n"
    return head.replace(
        "runs everything: unit, property, process, notebook and browser tests",
        "runs the check cells of your exercises",
    )


def release(out, root=ROOT) -> tuple[pathlib.Path, pathlib.Path]:
    """Write the student release to the new folder ``out`` and ``out.zip``; return both paths."""
    out, root = pathlib.Path(out).resolve(), pathlib.Path(root)
    if out.exists() and any(out.iterdir()):
        raise BadArgument("out", f"{out} exists and is not empty: name a new folder")
    if out in (root.resolve() / p for p in ("labkit", "notebooks", "exercises", "solutions")):
        raise BadArgument("out", f"{out} is a folder of the course; name a new folder")
    quizzes = set(json.loads((root / "solutions" / "keys.json").read_text()))
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    for lesson in sorted((root / "notebooks").glob("*.ipynb")):  # not notebooks/instructor/
        shutil.copy2(lesson, out / "notebooks" / lesson.name)
    (out / "exercises").mkdir()
    for solution in sorted((root / "solutions").glob("*.ipynb")):
        nb = exercise(json.loads(solution.read_text()), quizzes)
        text = json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
        (out / "exercises" / solution.name).write_text(text)
    shutil.copytree(root / "labkit", out / "labkit", ignore=SKIP)
    shutil.copy2(root / "pyproject.toml", out / "pyproject.toml")
    (out / "Makefile").write_text(makefile((root / "Makefile").read_text()))
    (out / "README.md").write_text(readme((root / "README.md").read_text()))
    archive = shutil.make_archive(str(out), "zip", out.parent, out.name)
    return out, pathlib.Path(archive)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m labkit.release", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out", type=pathlib.Path, help="a new folder; OUT.zip is written beside it")
    args = parser.parse_args(argv)
    try:
        folder, archive = release(args.out)
    except BadArgument as exc:
        parser.error(str(exc))
    files = [p for p in folder.rglob("*") if p.is_file()]
    print(f"wrote {folder} ({len(files)} files) and {archive}")
    return 0
