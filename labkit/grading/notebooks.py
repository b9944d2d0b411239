"""Solutions are the single source; exercises are generated from them.

A solution notebook marks each answer with ``### BEGIN SOLUTION`` and
``### END SOLUTION`` lines inside a code cell. The exercise copy replaces each
such block by ``raise NotImplementedError(...)`` at the block's indentation,
so defining the student's function still works and only the check cell that
calls it fails. Every output is cleared, except the stored pass line of check
cells (those starting with ``# NBVAL_CHECK_OUTPUT``): nbval compares against it.

Usage::

    python -m labkit.grading.notebooks build     # solutions/*.ipynb -> exercises/*.ipynb
    python -m labkit.grading.notebooks check     # exit 1 if any exercise is stale
    python -m labkit.grading.notebooks execute NB...   # run notebooks in place, store outputs
"""

from __future__ import annotations

import copy
import json
import pathlib
import re
import sys

__all__ = ["exercise_from_solution", "build", "stale", "CHECK_MARK"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK_MARK = "# NBVAL_CHECK_OUTPUT"
_BLOCK = re.compile(
    r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*(\n|$)",
    re.MULTILINE | re.DOTALL,
)
STUB = 'raise NotImplementedError("your answer goes here")'


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def is_check(cell) -> bool:
    """Whether ``cell`` is a grading check cell."""
    return cell.get("cell_type") == "code" and _source(cell).lstrip().startswith(CHECK_MARK)


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
        cell["source"] = strip_answer(_source(cell))
        if not is_check(cell):  # check cells keep their run and pass line: nbval compares them
            cell["execution_count"] = None
            cell["outputs"] = []
    return nb


def _dump(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def _pairs(root: pathlib.Path = ROOT):
    for sol in sorted((root / "solutions").glob("*.ipynb")):
        yield sol, root / "exercises" / sol.name


def build(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """Write ``exercises/NN.ipynb`` for every ``solutions/NN.ipynb``; return the paths."""
    written = []
    for sol, ex in _pairs(root):
        ex.write_text(_dump(exercise_from_solution(json.loads(sol.read_text()))))
        written.append(ex)
    return written


def stale(root: pathlib.Path = ROOT) -> list[str]:
    """Return the names of exercises that differ from what ``build`` would write."""
    names = [
        sol.name
        for sol, ex in _pairs(root)
        if not ex.exists()
        or ex.read_text() != _dump(exercise_from_solution(json.loads(sol.read_text())))
    ]
    extra = {p.name for p in (root / "exercises").glob("*.ipynb")} - {
        s.name for s, _ in _pairs(root)
    }
    return names + sorted(extra)


def execute(paths, timeout: int = 120) -> None:
    """Run each notebook in place with the current Python and store its outputs (for authors)."""
    import nbformat
    from nbclient import NotebookClient

    for path in map(pathlib.Path, paths):
        nb = nbformat.read(path, as_version=4)
        NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
        nb.metadata.pop("widgets", None)
        path.write_text(_dump(nb))


def main(argv: list[str]) -> int:
    command, *rest = argv or ["build"]
    if command == "build":
        for path in build():
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    if command == "check":
        names = stale()
        for name in names:
            print(f"stale: exercises/{name} (run `make exercises`)")
        return 1 if names else 0
    if command == "execute":
        execute(rest)
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
