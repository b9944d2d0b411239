"""Every exercise through the whole grader: a right, a wrong and a tampered submission each.

The answers come from the in-process corpora (tests/corpus_part*.py), pasted
into the answer cells of the generated exercise as a student would. The
right submission must pass every task, the wrong one must fail every task,
and the tampered one (wrong answers, check cells edited to print the pass
line, and an answer cell that rebinds ``labkit.grading.check``) must fail
every task too, because the grader puts the canonical check cells back. The
same run writes every student's feedback page: each broken property's
timeline is drawn (every wrong answer of the corpus gets its page in
tests/test_grading.py, from the verdicts judged there).
"""

import copy
import json

import pytest

from labkit.grading import grader, notebooks, verdicts

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
    """Grade a right, a wrong and a tampered submission per exercise in one grader run, and
    write every student's feedback page."""
    root = tmp_path_factory.mktemp("submissions")
    for path in EXERCISES:
        exercise = json.loads(path.read_text())
        students = [("right", _answered(exercise, _first("right"))),
                    ("tampered", _answered(exercise, _first("wrong"), tamper=True)),
                    ("wrong", _answered(exercise, _first("wrong")))]
        for student, nb in students:
            folder = root / f"{student}-{path.stem[:2]}"
            folder.mkdir()
            (folder / path.name).write_text(json.dumps(nb))
    # one OS-drawn seed for every notebook: the tampered copy is judged on the wrong one's inputs
    subs = grader.grade([str(root)], cell_timeout=60, jobs=2, seed=verdicts.draw_seed())
    pages = {p.stem: p.read_text() for p in grader.write_feedback(subs, root.parent / "pages")}
    return {s.student: s for s in subs} | {"pages": pages}


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


@pytest.mark.parametrize("exercise", [p.stem[:2] for p in EXERCISES])
def test_each_wrong_submission_gets_a_drawn_feedback_page(graded, exercise):
    """The wrong submission fails every task, and its feedback page (written in the same run as
    everyone's) shows each broken property's timeline as a picture: none is left undrawn, and no
    page fell back to words."""
    student = f"wrong-{exercise}"
    sub, page = graded[student], graded["pages"][student]
    assert set(sub.outcomes.values()) == {"fail"}, sub
    drawn = [f for r in sub.results.values() for f in r.failed() if f.broken and f.broken.events]
    assert "could not be drawn" not in page and page.count('src="data:image/png') == len(drawn), student


def test_values_come_back_with_their_declared_types(graded):
    """A token (epoch, n) that a 04.1 answer used comes back from the judge as a tuple, never a
    JSON list, in every event of every failure."""
    tokens = [e["generation"] for s, sub in graded.items() if s.endswith("-04")
              for r in sub.results.values() for f in r.failed() if f.broken for e in f.broken.events]
    assert any(isinstance(t, tuple) for t in tokens) and not any(isinstance(t, list) for t in tokens)
