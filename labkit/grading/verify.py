"""Re-check a graded notebook's check cells outside the student's kernel.

Inside the kernel an answer cell can patch anything first (``importlib.reload``,
IPython's hooks, labkit's modules). So the grader re-runs each notebook that passed
a task in a fresh process: its code cells (not check or ``# NBVAL_SKIP`` cells) run in
a plain IPython shell; then what a check cell relies on (``importlib``, ``print``,
``__import__``, ``labkit.grading``) is put back and each canonical check cell runs
with ``exec``. It passes if it raises nothing and prints exactly its stored output.
The core modules are not reloaded: the student's objects must keep the checks' classes.

Usage (by :mod:`labkit.grading.grader`): ``LABKIT_VERIFY_NONCE=... python -m
labkit.grading.verify NOTEBOOK`` prints the nonce, then ``{task: "pass" | "fail: why"}`` as JSON.
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


def _restore(grading) -> None:
    sys.modules["importlib"] = _PRISTINE["importlib"]
    importlib.reload, importlib.import_module = _PRISTINE["reload"], _PRISTINE["import_module"]
    builtins.print, builtins.__import__ = _PRISTINE["print"], _PRISTINE["__import__"]
    sys.modules["labkit.grading"] = grading


def _stored_output(cell) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


def main(path: str, nonce: str, write) -> None:
    """Run ``path``'s code cells, then each check cell against a fresh ``labkit``."""
    from labkit import grading
    from labkit.grading.notebooks import cell_source, is_check
    from labkit.grading.grader import task_of

    cells = [c for c in json.loads(open(path).read())["cells"] if c["cell_type"] == "code"]
    checks = [
        (task_of(c), compile(cell_source(c), "<check cell>", "exec"), _stored_output(c))
        for c in cells
        if is_check(c) and task_of(c)
    ]
    code = [
        cell_source(c)
        for c in cells
        if not is_check(c) and not cell_source(c).lstrip().startswith("# NBVAL_SKIP")
    ]
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    for source in code:
        with redirect_stdout(StringIO()), redirect_stderr(StringIO()):
            shell.run_cell(source)
    _restore(grading)
    results = {}
    for task, check, expected in checks:
        printed = StringIO()
        try:
            with redirect_stdout(printed):
                _PRISTINE["exec"](check, shell.user_ns)
            ok = printed.getvalue() == expected or not expected
            results[task] = "pass" if ok else f"fail: printed {printed.getvalue()!r}"
        except BaseException as exc:  # anything at all: the task failed
            first = (str(exc).splitlines() or [""])[0]
            results[task] = f"fail: {type(exc).__name__}: {first}"
    write(nonce + json.dumps(results) + "\n")


if __name__ == "__main__":
    _nonce = os.environ.pop("LABKIT_VERIFY_NONCE", "")
    _out = os.fdopen(os.dup(1), "w")
    main(sys.argv[1], _nonce, lambda text: (_out.write(text), _out.flush()))
