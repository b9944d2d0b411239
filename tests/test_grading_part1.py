"""The checks of lessons 01-04 tell right from wrong: the corpus answers, tampering, the exercises."""

from __future__ import annotations

import importlib
import json
import pathlib

import pytest

import labkit.grading
from corpus_part1 import CORPUS, TAMPER

ROOT = pathlib.Path(__file__).resolve().parent.parent
TASKS = sorted(CORPUS)
EXERCISES = ["01-expired-but-alive", "02-fencing-tokens", "03-dangerous-variants", "04-who-issues-the-numbers"]


def define(source: str, name: str):
    """Run an answer cell's source in a fresh namespace and return the function it defines."""
    namespace: dict = {}
    exec(compile(source, f"<answer {name}>", "exec"), namespace)
    return namespace[name]


def grade(task_id: str, answer):
    """Call the check exactly as a check cell does; return "PASS" or the failure text."""
    try:
        importlib.reload(labkit.grading).check(task_id, answer)
    except AssertionError as failure:        # CheckFailed (its class is re-created by the reload)
        assert type(failure).__name__ == "CheckFailed"
        return str(failure)
    return "PASS"


def cases(kind: str):
    return [pytest.param(t, label, id=f"{t}-{label}") for t in TASKS for label in CORPUS[t][kind]]


def test_every_task_has_enough_answers():
    """Each task has at least two alternative right answers and three wrong ones plus a constant."""
    for task_id, entry in CORPUS.items():
        assert len(entry["right"]) >= 2, task_id
        assert len(entry["wrong"]) >= 4 and any("constant" in k for k in entry["wrong"]), task_id
    assert set(CORPUS) <= set(labkit.grading.TASKS)


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
    assert "(seed " in message and f"labkit.grading.replay({task_id!r}" in message, message


@pytest.mark.parametrize("task_id", TASKS)
def test_unwritten_answer_fails(task_id):
    """The generated exercise's stub (raise NotImplementedError) fails its check."""
    stub = define(f"def {CORPUS[task_id]['name']}(*args, **kwargs):\n"
                  "    raise NotImplementedError('your answer goes here')\n", CORPUS[task_id]["name"])
    assert "it still raises NotImplementedError" in grade(task_id, stub)


@pytest.mark.parametrize("task_id", TASKS)
@pytest.mark.parametrize("how", sorted(TAMPER))
def test_tampering_with_the_grader_counts_for_nothing(task_id, how):
    """An answer cell that rebinds labkit.grading, then a constant answer: the check cell still fails."""
    entry = CORPUS[task_id]
    constant = next(source for label, (source, _) in entry["wrong"].items() if "constant" in label)
    try:
        message = grade(task_id, define(TAMPER[how] + constant, entry["name"]))
    finally:
        importlib.reload(labkit.grading)
    assert message != "PASS" and "(seed " in message, message


def test_the_race_really_interleaves_two_connections():
    """In the race schedule, B's write really lands between A's check and A's write (check-then-act)."""
    entry = CORPUS["02.1"]
    wrong = define(entry["wrong"]["check-then-act: read, compare in Python, write unconditionally"][0], entry["name"])
    schedule = next(s for s in labkit.grading.TASKS["02.1"].schedules if s.knobs.get("at") == 2)
    history: list = []
    with pytest.raises(labkit.grading.Broken, match="refused and writes nothing"):
        labkit.grading.TASKS["02.1"].trial(wrong, schedule, history)
    writes = [(e.worker, e.outcome, e.generation) for e in history if e.action == "write"]
    assert writes == [("B", "ok", 8), ("A", "ok", 7)]


def test_the_lock_really_keeps_b_out_while_a_is_inside():
    """With a correct answer, B's attempt inside A's transaction is refused by SQLite, then succeeds."""
    entry = CORPUS["02.1"]
    right = define(entry["right"]["labkit's Fence.guard"], entry["name"])
    schedule = next(s for s in labkit.grading.TASKS["02.1"].schedules if s.knobs.get("at") == 3)
    history: list = []
    labkit.grading.TASKS["02.1"].trial(right, schedule, history)
    assert [(e.worker, e.action, e.outcome) for e in history] == [
        ("A", "pause", "ok"), ("B", "wait", "busy"), ("A", "resume", "ok"), ("A", "write", "ok"),
        ("B", "write", "ok"), ("B", "raise", "ok"), ("A", "write", "rejected"), ("A", "write", "rejected")]


def _cleanup_trial(label: str, kind: str, race: str, at: int):
    """Run one 04.2 race schedule directly; return (broken property or None, the target holder's events)."""
    entry = CORPUS["04.2"]
    source = entry[kind][label] if kind == "right" else entry[kind][label][0]
    task = labkit.grading.TASKS["04.2"]
    schedule = next(s for s in task.schedules if s.knobs["race"] == race and s.knobs["at"] == at)
    history: list = []
    try:
        task.trial(define(source, entry["name"]), schedule, history)
        broken = None
    except labkit.grading.Broken as b:
        broken = b.prop
    target = next(e.target for e in history if e.action in ("renew", "acquire") and e.worker != "I"
                  and e.target.startswith("late" if race == "renew" else "boundary"))
    holder = next(e.worker for e in history if e.target == target)
    return broken, [("holder" if e.worker == holder else e.worker, e.action, e.outcome)
                    for e in history if e.target == target], history


def test_a_renewal_between_read_and_delete_really_loses_its_lease():
    """04.2: the holder renews between the cleanup's read and its DELETE; deleting by owner removes the renewed lease."""
    broken, events, history = _cleanup_trial("read, then delete by name and owner (a renewal lands in between)",
                                             "wrong", "renew", 2)
    assert broken and "never deletes a lease that is unexpired" in broken
    assert events == [("holder", "acquire", "ok"), ("holder", "renew", "ok"), ("holder", "release", "ok")]
    renewed = next(e for e in history if e.action == "renew")
    assert renewed.until > next(e.time for e in history if e.action == "cleanup")


def test_the_cleanups_write_lock_keeps_the_renewal_out_or_after():
    """04.2: with one conditional DELETE, a renewal before the cleanup is kept; one during it waits and is lost."""
    label = "BEGIN IMMEDIATE by hand, DELETE ... RETURNING fetched before COMMIT"
    broken, events, _ = _cleanup_trial(label, "right", "renew", 1)
    assert broken is None and events == [("holder", "acquire", "ok"), ("holder", "renew", "ok"), ("I", "acquire", "ok")]
    broken, events, _ = _cleanup_trial(label, "right", "renew", 2)
    assert broken is None
    assert events == [("holder", "acquire", "ok"), ("holder", "release", "ok"), ("holder", "renew", "lost"),
                      ("I", "acquire", "ok")]


def test_a_cleanup_that_drops_the_counter_really_reissues_old_generations():
    """04.2: after the naive cleanup, LeaseAuthority hands generation 1 to the next holder of an 8-times-used name."""
    entry = CORPUS["04.2"]
    naive = define(entry["wrong"]["deletes the counter with the lease (the lesson's naive cleanup)"][0], "cleanup")
    history: list = []
    with pytest.raises(labkit.grading.Broken, match="above every generation ever issued"):
        labkit.grading.TASKS["04.2"].trial(naive, labkit.grading.TASKS["04.2"].schedules[0], history)
    assert [(e.worker, e.generation) for e in history if e.action == "acquire"][-1] == ("I", 1)


def _run_exercise(name: str):
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(ROOT / "exercises" / f"{name}.ipynb", as_version=4)
    NotebookClient(nb, timeout=60, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ROOT / "exercises")}}).execute()
    return nb


@pytest.mark.parametrize("name", EXERCISES)
def test_unsolved_exercise_fails_exactly_at_its_check_cells(name):
    """Run the generated exercise: every check cell fails (answer not written) and no other cell does."""
    if not (ROOT / "exercises" / f"{name}.ipynb").exists():
        pytest.skip(f"exercises/{name}.ipynb is not written yet")
    nb = _run_exercise(name)
    failed, checks = [], []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if cell.source.lstrip().startswith("# NBVAL_CHECK_OUTPUT"):
            checks.append(i)
            assert errors and errors[0].ename == "CheckFailed", (i, cell.source)
            assert "NotImplementedError" in errors[0].evalue, errors[0].evalue
        elif errors and not cell.source.lstrip().startswith("# NBVAL_SKIP"):
            failed.append((i, errors[0].ename, errors[0].evalue))
    assert checks and not failed, failed
    tags = [t for c in nb.cells for t in c.metadata.get("tags", []) if t.startswith("task:")]
    assert sorted(tags) == sorted(f"task:{t}" for t in TASKS if t.startswith(name[:2])), tags


def test_solutions_store_the_pass_lines():
    """Each solution's check cells store exactly the pass line of their task."""
    for name in EXERCISES:
        path = ROOT / "solutions" / f"{name}.ipynb"
        if not path.exists():
            continue
        for cell in json.loads(path.read_text())["cells"]:
            tags = [t[5:] for t in cell.get("metadata", {}).get("tags", []) if t.startswith("task:")]
            if tags:
                text = "".join(o.get("text", "") for o in cell["outputs"])
                title = labkit.grading.TASKS[tags[0]].title
                assert text == f"PASS {tags[0]}: {title} held under every schedule\n", (name, text)
