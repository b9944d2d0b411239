"""Answers that do nothing, for every task: each must score 0 points (issue 26).

``NOTHING[task]`` maps a label to an answer cell's source defining the task's function. Each
is one way to do nothing while looking like an answer: the identity (the first argument back),
a constant of the type the task's answer returns, the input passed back (the last argument,
as ``deadline = send_time`` does for 05.1), and an empty body. They take any arguments, so one
set of four serves every task; the constant is chosen per task from the types it returns.
"""

import labkit.grading

LABELS = ("the identity", "a constant", "the input passed back", "an empty body")
_BODIES = {
    "the identity": "    return args[0] if args else None\n",
    "the input passed back": "    return (list(args) + list(kwargs.values()) or [None])[-1]\n",
    "an empty body": "    pass\n",
}
#: the constant of each declared return type: one that claims success or a plausible value
_CONSTANTS = {bool: "True", int: "1", float: "1.0", str: "'fence'", dict: "{}", type(None): "None"}


def _constant(task) -> str:
    kind = next((t for t in task.returns if t in _CONSTANTS), type(None))
    return f"    return {_CONSTANTS[kind]}\n"


def nothing(task_id: str, name: str) -> dict[str, str]:
    """The do-nothing answers of ``task_id`` whose function is ``name``."""
    task = labkit.grading.TASKS[task_id]
    bodies = {**_BODIES, "a constant": _constant(task)}
    return {label: f"def {name}(*args, **kwargs):\n{body}" for label, body in bodies.items()}
