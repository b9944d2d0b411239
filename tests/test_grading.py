"""Every check tells right from wrong: the corpus answers, tampering, the exercises, the solutions."""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import pathlib

import pytest

import corpus_part1
import corpus_part2
import labkit
import labkit.grading
from labkit.grading.scores import Finding, Report
from answers import TAMPER, judged
from corpus_nothing import LABELS as NOTHING, nothing

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = {**corpus_part1.CORPUS, **corpus_part2.CORPUS}
TASKS = sorted(CORPUS)
EXERCISES = sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb"))


def cases(kind: str):
    return [pytest.param(t, label, id=f"{t}-{label}") for t in TASKS for label in CORPUS[t][kind]]


def test_every_task_has_enough_answers():
    """Each task has at least two alternative right answers and four wrong ones, a constant
    among them, and for each property a wrong answer that breaks that property alone."""
    for task_id, entry in CORPUS.items():
        assert len(entry["right"]) >= 2, task_id
        assert len(entry["wrong"]) >= 4 and any("constant" in k for k in entry["wrong"]), task_id
        alone = {props for _, _, props in entry["wrong"].values() if isinstance(props, str)}
        assert alone == set(labkit.grading.TASKS[task_id].properties), task_id
    assert set(CORPUS) == set(labkit.grading.TASKS)


def test_every_task_declares_named_properties():
    """Every task names at least two properties in plain words, and shares 10 points among them."""
    for task_id, t in labkit.grading.TASKS.items():
        assert len(t.properties) >= 2 and "" not in t.properties, task_id
        assert all(len(words.split()) >= 4 for words in t.properties.values()), task_id


@pytest.fixture(scope="module")
def verdicts():
    """Every right answer, stub, do-nothing answer and tampering prefix judged, one sandbox per
    task (the wrong answers go through the whole grader: tests/test_grade_corpus.py)."""
    jobs, only = [], os.environ.get("LABKIT_TEST_TASKS")  # e.g. "02.1,02.2" while writing a check
    for task_id, entry in CORPUS.items():
        if only and task_id not in only.split(","):
            continue
        constant = next(src for label, (src, *_) in entry["wrong"].items() if "constant" in label)
        sources = {("right", k): v for k, v in entry["right"].items()}
        sources[("stub", "")] = (f"def {entry['name']}(*args, **kwargs):\n"
                                 "    raise NotImplementedError('your answer goes here')\n")
        sources[("empty", "")] = f"def {entry['name']}(*args, **kwargs):\n    pass\n"
        sources |= {("nothing", label): src for label, src in nothing(task_id, entry["name"]).items()}
        sources |= {("tamper", how): TAMPER[how] + constant for how in TAMPER}
        jobs.append((task_id, entry["name"], sources))
    fork = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=fork) as pool:  # one per core
        done = pool.map(judged, *zip(*jobs))
        return {(t, *key): got for (t, _, _), verdicts in zip(jobs, done) for key, got in verdicts.items()}


@pytest.mark.parametrize("task_id,label", cases("right"))
def test_alternative_correct_answers_pass(verdicts, task_id, label):
    """A correct answer written in another style passes in the sandbox with full points: every
    property checked by some schedule, and held by all."""
    report = verdicts[task_id, "right", label]
    title = labkit.grading.TASKS[task_id].title
    assert report.passed and report.total() == (10.0, 10.0), report.text()
    assert report.text().startswith(f"PASS {task_id}: {title} held under every schedule (10/10 points)")


@pytest.mark.parametrize("task_id", TASKS)
def test_unwritten_answer_fails(verdicts, task_id):
    """The generated exercise's stub (raise NotImplementedError) scores nothing and says why."""
    report = verdicts[task_id, "stub", ""]
    assert report.total()[0] == 0 and "it still raises NotImplementedError" in report.text()


@pytest.mark.parametrize("task_id", TASKS)
def test_an_empty_answer_scores_nothing(verdicts, task_id):
    """An answer whose body is ``pass`` (it returns None) scores 0 points, like a constant."""
    report = verdicts[task_id, "empty", ""]
    assert not report.passed and report.total()[0] == 0, report.text()


@pytest.mark.parametrize("label", NOTHING)
@pytest.mark.parametrize("task_id", TASKS)
def test_an_answer_that_does_nothing_scores_nothing_in_every_task(verdicts, task_id, label):
    """The identity, a constant of the task's return type, the input passed back, an empty body
    (tests/corpus_nothing.py): no property of any task in labkit.grading.TASKS holds for one, 0 points."""
    report = verdicts[task_id, "nothing", label]
    assert not report.passed and report.total()[0] == 0, report.text()


@pytest.mark.parametrize("task_id", TASKS)
@pytest.mark.parametrize("how", sorted(TAMPER))
def test_tampering_with_the_grader_counts_for_nothing(verdicts, task_id, how):
    """An answer cell that rebinds labkit.grading, then a constant answer: it still scores 0 (the
    sandbox has no labkit.grading to rebind, and the judge shares nothing with it)."""
    report = verdicts[task_id, "tamper", how]
    assert not report.passed and report.total()[0] == 0 and task_id in report.text(), report.text()


def _run_exercise(name: str):
    import nbformat
    from kernels import Client as NotebookClient
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
            shown = "\n".join(errors[0].traceback)  # the scorecard alone: no frame of the grader's
            assert "0/10 points" in shown and "labkit/grading" not in shown and "File " not in shown, shown
        elif errors and not cell.source.lstrip().startswith("# NBVAL_SKIP"):
            failed.append((i, errors[0].ename, errors[0].evalue))
    assert checks and not failed, failed
    tags = [t for c in nb.cells for t in c.metadata.get("tags", []) if t.startswith("task:")]
    assert sorted(tags) == sorted(f"task:{t}" for t in TASKS if t.startswith(name[:2])), tags


def test_solutions_store_the_pass_lines():
    """Each solution's check cells store exactly the full-points scorecard of their task (the pass
    line, then each property with its points), and every task has one."""
    seen = set()
    for name in EXERCISES:
        for cell in json.loads((ROOT / "solutions" / f"{name}.ipynb").read_text())["cells"]:
            tags = [t[5:] for t in cell.get("metadata", {}).get("tags", []) if t.startswith("task:")]
            if tags:
                text = "".join(o.get("text", "") for o in cell["outputs"])
                t = labkit.grading.TASKS[tags[0]]
                full = Report(t.id, t.title, "answer", tuple(Finding(p, w, 1) for p, w in t.properties.items()))
                assert text == full.text() + "\n", (name, text)
                seen.add(tags[0])
    assert seen == set(TASKS)


def test_unknown_task_or_seed_is_a_named_error():
    """Asking for a task or a replay seed that does not exist names the argument."""
    with pytest.raises(labkit.BadArgument, match="task_id"):
        labkit.grading.check("99.9", print)
    with pytest.raises(labkit.BadArgument, match="seed"):
        labkit.grading.replay("02.1", print, seed=-5)
