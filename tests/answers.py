"""Running a corpus answer the way a notebook does: define it, then check it as a check cell would."""

from __future__ import annotations

import importlib

import labkit.grading


def define(source: str, name: str):
    """Run an answer cell's source in a fresh namespace and return the function it defines."""
    namespace: dict = {}
    exec(compile(source, f"<answer {name}>", "exec"), namespace)
    return namespace[name]


def grade(task_id: str, answer) -> str:
    """Call the check exactly as a check cell does; return "PASS" or the failure text."""
    try:
        importlib.reload(labkit.grading).check(task_id, answer)
    except AssertionError as failure:        # CheckFailed (its class is re-created by the reload)
        assert type(failure).__name__ == "CheckFailed"
        return str(failure)
    return "PASS"
