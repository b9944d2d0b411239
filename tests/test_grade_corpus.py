"""Every exercise through the whole grader: a right, a wrong and a tampered submission each.

The answers come from the in-process corpora (tests/corpus_part*.py), pasted
into the answer cells of the generated exercise as a student would. The
right submission must pass every task, the wrong one must fail every task,
and the tampered one (wrong answers, check cells edited to print the pass
line, and an answer cell that rebinds ``labkit.grading.check``) must fail
every task too, because the grader puts the canonical check cells back.
"""

import copy
import json

import pytest

from labkit.grading import grader, notebooks

import answers
import corpus_part1
import corpus_part2

CORPUS = {**corpus_part1.CORPUS, **corpus_part2.CORPUS}
TAMPER = answers.TAMPER["rebinds check to print the pass line"]
EXERCISES = sorted((notebooks.ROOT / "exercises").glob("*.ipynb"))


def _answered(exercise: dict, pick, tamper: bool = False) -> dict:
    """Fill each task's answer cell (the code cell before its check) with ``pick(task)``."""
    nb = copy.deepcopy(exercise)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for before, cell in zip(code, code[1:]):
        tid = grader.task_of(cell)
        if tid is None:
            continue
        before["source"] = (TAMPER if tamper else "") + pick(tid)
        if tamper:
            line = cell["outputs"][0]["text"]
            cell["source"] = f"# NBVAL_CHECK_OUTPUT\nprint({''.join(line).strip()!r})"
    return nb


def _first(kind):
    def pick(tid):
        entry = next(iter(CORPUS[tid][kind].values()))
        return entry if kind == "right" else entry[0]
    return pick


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade three submissions per exercise in one grader run."""
    root = tmp_path_factory.mktemp("submissions")
    for path in EXERCISES:
        exercise = json.loads(path.read_text())
        for student, nb in (("right", _answered(exercise, _first("right"))),
                            ("wrong", _answered(exercise, _first("wrong"))),
                            ("tampered", _answered(exercise, _first("wrong"), tamper=True))):
            folder = root / f"{student}-{path.stem[:2]}"
            folder.mkdir()
            (folder / path.name).write_text(json.dumps(nb))
    return {s.student: s for s in grader.grade([str(root)], cell_timeout=60, jobs=2)}


def test_the_corpus_covers_every_task():
    """Every task of every exercise has right and wrong answers in the corpus."""
    tasks = {grader.task_of(c) for p in EXERCISES for c in json.loads(p.read_text())["cells"]} - {None}
    assert tasks and tasks <= set(CORPUS)


@pytest.mark.parametrize("exercise", [p.stem[:2] for p in EXERCISES])
def test_right_wrong_and_tampered_submissions(graded, exercise):
    """Right passes every task with full points; wrong and tampered fail every task, and the
    tampered copy of the wrong answers scores exactly what they score."""
    right, wrong, tampered = (graded[f"{s}-{exercise}"] for s in ("right", "wrong", "tampered"))
    assert right.results and set(right.outcomes.values()) == {"pass"}, right
    assert set(wrong.results) == set(right.results) and set(wrong.outcomes.values()) == {"fail"}, wrong
    assert set(tampered.results) == set(right.results) and set(tampered.outcomes.values()) == {"fail"}, tampered
    points = {s.student: grader.totals([s])[s.student] for s in (right, wrong, tampered)}
    assert points[right.student][0] == points[right.student][1] > points[wrong.student][0], points
    assert points[tampered.student] == points[wrong.student], points  # tampering gains nothing
