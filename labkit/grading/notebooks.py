"""Solutions are the single source; exercises are generated from them.

Each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` block of a solution's code
cell becomes ``raise NotImplementedError(...)`` at the block's indentation, so
only the check cell that calls the answer fails. Every output is cleared except
the stored pass line of check cells (``# NBVAL_CHECK_OUTPUT``): nbval compares it.

Usage::

    python -m labkit.grading.notebooks build     # solutions/*.ipynb -> exercises/*.ipynb
    python -m labkit.grading.notebooks check     # exit 1 if any exercise is stale
"""

from __future__ import annotations

import copy
import json
import pathlib
import re
import sys

__all__ = ["exercise_from_solution", "build", "stale", "program", "CHECK_MARK"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK_MARK = "# NBVAL_CHECK_OUTPUT"
_BLOCK = re.compile(
    r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*(\n|$)",
    re.MULTILINE | re.DOTALL,
)
STUB = 'raise NotImplementedError("your answer goes here")'


def cell_source(cell) -> str:
    """A cell's source as one string (notebook JSON may store a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def is_check(cell) -> bool:
    """Whether ``cell`` is a grading check cell."""
    return cell.get("cell_type") == "code" and cell_source(cell).lstrip().startswith(CHECK_MARK)


CHECK_CALL = re.compile(r"check\(\s*[\"'](\d\d\.\d)[\"']\s*,\s*([A-Za-z_]\w*)\s*\)")


def program(sources: list[str]) -> list[tuple]:
    """What the judge runs, from a notebook's code cells in order (the grader) or the kernel's
    ``In`` (a check cell): ``("code", source)`` per cell, ``("check", task, name)`` per check
    cell; ``# NBVAL_SKIP`` cells are left out."""
    items = []
    for source in sources:
        if source.lstrip().startswith(CHECK_MARK):
            if found := CHECK_CALL.search(source):
                items.append(("check", *found.groups()))
        elif not source.lstrip().startswith("# NBVAL_SKIP"):
            items.append(("code", source))
    return items


def strip_answer(source: str) -> str:
    """Replace every solution block in ``source`` by a stub at the block's indentation."""
    return _BLOCK.sub(lambda m: f"{m.group(1)}{STUB}{m.group(2)}", source)


def exercise_from_solution(solution: dict) -> dict:
    """Return the exercise notebook (a dict) generated from a solution notebook (a dict)."""
    nb = copy.deepcopy(solution)
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        cell["source"] = strip_answer(cell_source(cell))
        if not is_check(cell):  # check cells keep their run and pass line: nbval compares them
            cell["execution_count"] = None
            cell["outputs"] = []
    return nb


def _dump(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def _pairs(root: pathlib.Path = ROOT):
    for sol in sorted((root / "solutions").glob("*.ipynb")):
        yield sol, root / "exercises" / sol.name


def _generated(solution: pathlib.Path) -> str:
    return _dump(exercise_from_solution(json.loads(solution.read_text())))


def build(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """Write ``exercises/NN.ipynb`` for every ``solutions/NN.ipynb``; return the paths."""
    written = []
    for sol, ex in _pairs(root):
        ex.write_text(_generated(sol))
        written.append(ex)
    return written


def stale(root: pathlib.Path = ROOT) -> list[str]:
    """Return the names of exercises that differ from what ``build`` would write."""
    pairs = list(_pairs(root))
    names = [sol.name for sol, ex in pairs if not ex.exists() or ex.read_text() != _generated(sol)]
    extra = {p.name for p in (root / "exercises").glob("*.ipynb")} - {s.name for s, _ in pairs}
    return names + sorted(extra)


def main(argv: list[str]) -> int:
    command = (argv or ["build"])[0]
    if command == "build":
        for path in build():
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    if command == "check":
        names = stale()
        for name in names:
            print(f"stale: exercises/{name} (run `make exercises`)")
        return 1 if names else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
