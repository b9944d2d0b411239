"""Every check tells right from wrong: the corpus answers, tampering, the exercises, the solutions."""

from __future__ import annotations

import concurrent.futures
import importlib
import json
import multiprocessing
import pathlib

import pytest

import corpus_part1
import corpus_part2
import labkit
import labkit.grading
from answers import TAMPER, judged

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = {**corpus_part1.CORPUS, **corpus_part2.CORPUS}
TASKS = sorted(CORPUS)
EXERCISES = sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb"))


def cases(kind: str):
    return [pytest.param(t, label, id=f"{t}-{label}") for t in TASKS for label in CORPUS[t][kind]]


def test_every_task_has_enough_answers():
    """Each task has at least two alternative right answers and four wrong ones, a constant among them."""
    for task_id, entry in CORPUS.items():
        assert len(entry["right"]) >= 2, task_id
        assert len(entry["wrong"]) >= 4 and any("constant" in k for k in entry["wrong"]), task_id
    assert set(CORPUS) == set(labkit.grading.TASKS)


@pytest.fixture(scope="module")
def verdicts():
    """Every corpus answer, every stub and every tampering prefix judged, one sandbox per task."""
    jobs = []
    for task_id, entry in CORPUS.items():
        constant = next(src for label, (src, _) in entry["wrong"].items() if "constant" in label)
        sources = {("right", k): v for k, v in entry["right"].items()}
        sources |= {("wrong", k): v[0] for k, v in entry["wrong"].items()}
        sources[("stub", "")] = (f"def {entry['name']}(*args, **kwargs):\n"
                                 "    raise NotImplementedError('your answer goes here')\n")
        sources |= {("tamper", how): TAMPER[how] + constant for how in TAMPER}
        jobs.append((task_id, entry["name"], sources))
    fork = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=fork) as pool:  # one per core
        done = pool.map(judged, *zip(*jobs))
        return {(t, *key): got for (t, _, _), verdicts in zip(jobs, done) for key, got in verdicts.items()}


@pytest.mark.parametrize("task_id,label", cases("right"))
def test_alternative_correct_answers_pass(verdicts, task_id, label):
    """A correct answer written in another style passes in the sandbox, with the fixed pass line."""
    title = labkit.grading.TASKS[task_id].title
    assert verdicts[task_id, "right", label] == (True, f"PASS {task_id}: {title} held under every schedule")


@pytest.mark.parametrize("task_id,label", cases("wrong"))
def test_known_wrong_answers_fail_naming_property_and_seed(verdicts, task_id, label):
    """A known-wrong answer fails; the message names the broken property, the seed and a replay call."""
    passed, message = verdicts[task_id, "wrong", label]
    assert not passed, f"{label!r} passed"
    assert CORPUS[task_id]["wrong"][label][1] in message, message
    assert "(seed " in message and f"labkit.grading.replay({task_id!r}" in message, message


@pytest.mark.parametrize("task_id", TASKS)
def test_unwritten_answer_fails(verdicts, task_id):
    """The generated exercise's stub (raise NotImplementedError) fails its check."""
    passed, message = verdicts[task_id, "stub", ""]
    assert not passed and "it still raises NotImplementedError" in message, message


@pytest.mark.parametrize("task_id", TASKS)
@pytest.mark.parametrize("how", sorted(TAMPER))
def test_tampering_with_the_grader_counts_for_nothing(verdicts, task_id, how):
    """An answer cell that rebinds labkit.grading, then a constant answer: it still fails (the
    sandbox has no labkit.grading to rebind, and the judge shares nothing with it)."""
    passed, message = verdicts[task_id, "tamper", how]
    assert not passed and task_id in message, message


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
    nb = _run_exercise(name)
    failed, checks = [], []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if cell.source.lstrip().startswith("# NBVAL_CHECK_OUTPUT") and "task:" in str(cell.metadata.get("tags")):
            checks.append(i)
            assert errors and errors[0].ename == "CheckFailed", (i, cell.source)
            assert "NotImplementedError" in errors[0].evalue, errors[0].evalue
        elif errors and not cell.source.lstrip().startswith("# NBVAL_SKIP"):
            failed.append((i, errors[0].ename, errors[0].evalue))
    assert checks and not failed, failed
    tags = [t for c in nb.cells for t in c.metadata.get("tags", []) if t.startswith("task:")]
    assert sorted(tags) == sorted(f"task:{t}" for t in TASKS if t.startswith(name[:2])), tags


def test_solutions_store_the_pass_lines():
    """Each solution's check cells store exactly the pass line of their task, and every task has one."""
    seen = set()
    for name in EXERCISES:
        for cell in json.loads((ROOT / "solutions" / f"{name}.ipynb").read_text())["cells"]:
            tags = [t[5:] for t in cell.get("metadata", {}).get("tags", []) if t.startswith("task:")]
            if tags:
                text = "".join(o.get("text", "") for o in cell["outputs"])
                title = labkit.grading.TASKS[tags[0]].title
                assert text == f"PASS {tags[0]}: {title} held under every schedule\n", (name, text)
                seen.add(tags[0])
    assert seen == set(TASKS)


def test_unknown_task_or_seed_is_a_named_error():
    """Asking for a task or a replay seed that does not exist names the argument."""
    with pytest.raises(labkit.BadArgument, match="task_id"):
        labkit.grading.check("99.9", print)
    with pytest.raises(labkit.BadArgument, match="seed"):
        labkit.grading.replay("02.1", print, seed=-5)
