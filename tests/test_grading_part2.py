"""The checks of lessons 05-09 tell right from wrong: the corpus answers, tampering, the exercises."""

from __future__ import annotations

import importlib
import json
import pathlib

import pytest

import labkit.grading
from corpus_part2 import CORPUS, TAMPER

ROOT = pathlib.Path(__file__).resolve().parent.parent
TASKS = sorted(CORPUS)


def define(source: str, name: str):
    """Run an answer cell's source in a fresh namespace and return the function it defines."""
    namespace: dict = {}
    exec(compile(source, f"<answer {name}>", "exec"), namespace)
    return namespace[name]


def grade(task_id: str, answer):
    """Call the check exactly as a check cell does; return the pass line or the failure text."""
    try:
        importlib.reload(labkit.grading).check(task_id, answer)
    except AssertionError as failure:        # CheckFailed (its class is re-created by the reload)
        assert type(failure).__name__ == "CheckFailed"
        return str(failure)
    return "PASS"


def cases(kind: str):
    return [pytest.param(t, label, id=f"{t}-{label}") for t in TASKS for label in CORPUS[t][kind]]


@pytest.mark.parametrize("task_id,label", cases("right"))
def test_alternative_correct_answers_pass(task_id, label, capsys):
    """A correct answer written in another style passes and prints the fixed pass line."""
    entry = CORPUS[task_id]
    assert grade(task_id, define(entry["right"][label], entry["name"])) == "PASS"
    title = labkit.grading.TASKS[task_id].title
    assert capsys.readouterr().out == f"PASS {task_id}: {title} held under every schedule\n"


@pytest.mark.parametrize("task_id,label", cases("wrong"))
def test_known_wrong_answers_fail_naming_property_and_seed(task_id, label):
    """A known-wrong answer fails; the message names the broken property, the seed and a replay call."""
    entry = CORPUS[task_id]
    source, phrase = entry["wrong"][label]
    message = grade(task_id, define(source, entry["name"]))
    assert message != "PASS", f"{label!r} passed"
    assert phrase in message, message
    assert "seed" in message and f"labkit.grading.replay({task_id!r}" in message, message


@pytest.mark.parametrize("task_id", TASKS)
def test_unwritten_answer_fails(task_id):
    """The generated exercise's stub (raise NotImplementedError) fails its check."""
    stub = define(f"def {CORPUS[task_id]['name']}(*args, **kwargs):\n"
                  "    raise NotImplementedError('your answer goes here')\n", CORPUS[task_id]["name"])
    assert "it still raises NotImplementedError" in grade(task_id, stub)


@pytest.mark.parametrize("task_id", TASKS)
@pytest.mark.parametrize("how", sorted(TAMPER))
def test_tampering_with_the_grader_counts_for_nothing(task_id, how):
    """An answer cell that rebinds labkit.grading, then a wrong answer: the check cell still fails."""
    entry = CORPUS[task_id]
    source, _ = next(iter(entry["wrong"].values()))
    try:
        wrong = define(TAMPER[how] + source, entry["name"])
        message = grade(task_id, wrong)
    finally:
        importlib.reload(labkit.grading)
    assert message != "PASS" and "seed" in message, message
