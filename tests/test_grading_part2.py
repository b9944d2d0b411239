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
EXERCISES = ["05-late-renewal", "06-lease-hygiene", "07-recovery", "08-transfer-file-and-email", "09-review"]


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


def test_every_task_has_enough_answers():
    """Each task has at least two alternative right answers and three wrong ones plus a constant."""
    for task_id, entry in CORPUS.items():
        assert len(entry["right"]) >= 2, task_id
        assert len(entry["wrong"]) >= 4 and any("constant" in k for k in entry["wrong"]), task_id
    assert set(CORPUS) == {t for t in labkit.grading.TASKS if t[:2] in ("05", "06", "07", "08", "09")}


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
        pytest.skip(f"exercises/{name}.ipynb is not written")
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
    """Each solution's check cells store exactly the pass line of their task, and nothing else."""
    seen = set()
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
                seen.add(tags[0])
    assert seen == set(TASKS)


def _trial(task_id: str, source: str, name: str, schedule_name: str):
    """Run one schedule of a task's trial directly; return (broken property or None, history)."""
    task = labkit.grading.TASKS[task_id]
    schedule = next(s for s in task.schedules if s.name == schedule_name)
    history: list = []
    try:
        task.trial(define(source, name), schedule, history)
    except labkit.grading.Broken as broken:
        return broken.prop, history
    return None, history


def test_a_late_release_really_deletes_the_successors_lease_when_it_reads_first():
    """06.1 race: B's acquire lands between the read and the DELETE; the naive release then removes B's lease."""
    wrong = CORPUS["06.1"]["wrong"]["read, compare in Python, then delete by name"][0]
    broken, history = _trial("06.1", wrong, "release", "B takes over just before the release's 2nd statement")
    assert broken and "answers False" in broken
    assert [(e.worker, e.action, e.outcome) for e in history][-2:] == [("B", "acquire", "ok"), ("A", "release", "ok")]
    right = CORPUS["06.1"]["right"]["sqlite-utils cursor, named parameters"]
    broken, history = _trial("06.1", right, "release", "B takes over just before the release's 1st statement")
    assert broken is None and history[-1].outcome == "lost"


def test_the_holder_counting_from_arrival_really_acts_after_b_took_over():
    """05.2: with 6-8 s answers, the arrival-counting holder writes while B holds the lease; the right one never does."""
    wrong = CORPUS["05.2"]["wrong"]["deadline counted from the response's arrival"][0]
    broken, history = _trial("05.2", wrong, "keep_working", "slow responses: each renewal's answer spends 6-8 s in the network")
    assert broken and "after the conservative deadline" in broken
    b_at = next(e.time for e in history if e.worker == "B" and e.action == "acquire")
    assert any(e.worker == "A" and e.action == "write" and e.time > b_at for e in history)
    right = CORPUS["05.2"]["right"]["renew before every unit, keep the later deadline"]
    broken, history = _trial("05.2", right, "keep_working", "slow responses: each renewal's answer spends 6-8 s in the network")
    b_at = next((e.time for e in history if e.worker == "B" and e.action == "acquire"), float("inf"))
    assert broken is None and not any(e.worker == "A" and e.action == "write" and e.time >= b_at for e in history)


def test_the_stale_workers_email_really_goes_out_unless_it_is_an_intent():
    """08.2: A (7) sends directly and its email reaches the provider; as an outbox intent it is fenced out."""
    story = "B (8) has raised the fence; stale A (7) wakes up and publishes before B does"
    wrong = CORPUS["08.2"]["wrong"]["email sent before the fenced commit"][0]
    broken, history = _trial("08.2", wrong, "publish_report", story)
    assert broken and "stale worker's email" in broken
    assert any(e.worker == "A" and e.action == "email" and e.generation == 7 for e in history)
    right = CORPUS["08.2"]["right"]["catches the stale error and answers False"]
    broken, history = _trial("08.2", right, "publish_report", story)
    assert broken is None
    assert [(e.worker, e.outcome) for e in history if e.action == "write"] == [("A", "rejected"), ("B", "ok")]
    assert [e.target for e in history if e.action == "email"] == [history[-1].target] and "stale" not in history[-1].target


def test_a_crashed_worker_really_leaves_invoices_the_checkpoint_does_not_know():
    """07.2: B dies after 4 invoices with progress 3; without ids C issues c4 again, with ids it does not."""
    story = "B dies just after its 4th invoice commits, before the checkpoint catches up"
    wrong = CORPUS["07.2"]["wrong"]["no operation id"][0]
    broken, history = _trial("07.2", wrong, "run_job", story)
    assert broken and "never repeats an invoice" in broken
    c4 = [e.worker for e in history if e.action == "write" and "(c4)" in e.target]
    assert c4 == ["B", "C"]
    right = CORPUS["07.2"]["right"]["labkit.recovery.produce per unit, checkpoint on the batch's last unit"]
    broken, history = _trial("07.2", right, "run_job", story)
    assert broken is None and [e.worker for e in history if e.action == "crash"] == ["B"]
    assert sorted(e.target.split()[1] for e in history if e.action == "write") == \
        [f"(c{i})" for i in range(1, 7)]
