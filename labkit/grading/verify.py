"""Re-check a graded notebook's check cells outside the student's kernel.

A check cell runs inside the student's kernel, where an answer cell can
patch anything first (``importlib.reload``, IPython's exception hooks,
labkit's own modules). So the grader re-runs every notebook that passed a
task under nbval in a fresh process: it runs the notebook's code cells (not
the check cells, not ``# NBVAL_SKIP`` cells) in a plain IPython shell, then
puts back what a check cell relies on (``importlib`` and its ``reload``,
``print``, ``__import__``, the module ``labkit.grading`` itself), and runs
each canonical check cell with ``exec``: its ``reload`` re-executes the
grading modules from their source, it passes if it raises nothing and prints
exactly its stored output. (The core modules are not reloaded: the
student's objects must stay of the same classes as the checks' objects.) A task passes
only if it passes both ways.

Usage (by :mod:`labkit.grading.grader`): ``LABKIT_VERIFY_NONCE=... python -m labkit.grading.verify NOTEBOOK``;
prints one line, the nonce followed by a JSON object ``{task: "pass" | "fail: why"}``.
"""

from __future__ import annotations

import builtins
import importlib
import json
import os
import sys
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO

__all__ = ["main"]

_PRISTINE = {
    "importlib": importlib,
    "reload": importlib.reload,
    "import_module": importlib.import_module,
    "print": builtins.print,
    "__import__": builtins.__import__,
    "exec": builtins.exec,
}


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _restore(grading) -> None:
    sys.modules["importlib"] = _PRISTINE["importlib"]
    importlib.reload, importlib.import_module = _PRISTINE["reload"], _PRISTINE["import_module"]
    builtins.print, builtins.__import__ = _PRISTINE["print"], _PRISTINE["__import__"]
    sys.modules["labkit.grading"] = grading


def main(path: str, nonce: str, write) -> None:
    """Run ``path``'s code cells, then each check cell against a fresh ``labkit``."""
    from labkit import grading
    from labkit.grading.notebooks import is_check
    from labkit.grading.grader import task_of

    cells = [c for c in json.loads(open(path).read())["cells"] if c["cell_type"] == "code"]
    checks = [c for c in cells if is_check(c) and task_of(c)]
    code = [
        _source(c)
        for c in cells
        if not is_check(c) and not _source(c).lstrip().startswith("# NBVAL_SKIP")
    ]
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    for source in code:
        with redirect_stdout(StringIO()), redirect_stderr(StringIO()):
            shell.run_cell(source)
    _restore(grading)
    results = {}
    for cell in checks:
        expected = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
        printed = StringIO()
        try:
            with redirect_stdout(printed):
                _PRISTINE["exec"](compile(_source(cell), "<check cell>", "exec"), shell.user_ns)
            ok = printed.getvalue() == expected or not expected
            results[task_of(cell)] = "pass" if ok else f"fail: printed {printed.getvalue()!r}"
        except BaseException as exc:  # anything at all: the task failed
            first = (str(exc).splitlines() or [""])[0]
            results[task_of(cell)] = f"fail: {type(exc).__name__}: {first}"
    write(nonce + json.dumps(results) + "\n")


if __name__ == "__main__":
    _nonce = os.environ.pop("LABKIT_VERIFY_NONCE", "")
    _out = os.fdopen(os.dup(1), "w")
    main(sys.argv[1], _nonce, lambda text: (_out.write(text), _out.flush()))
