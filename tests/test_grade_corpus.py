"""Every wrong answer of the corpus through the whole grader, in one run, with its feedback page.

The answers come from the in-process corpora (tests/corpus_part*.py), pasted into the answer
cells of the generated exercise as a student would. One grader run grades, per exercise, a
right submission, a tampered one (the first wrong answers, check cells edited to print the pass
line, and an answer cell that rebinds ``labkit.grading.check``), and as many wrong submissions
as its task with the most wrong answers has: the k-th one answers each task with its k-th wrong
answer (a task with fewer keeps the exercise's stub). The right submission must pass every task,
every wrong answer must break exactly the properties the corpus says, and the tampered copy must
score what the plain one scores, because the grader puts the canonical check cells back. The same
run writes every student's feedback page (``--feedback``), so every wrong answer of every task
gets its page, with each broken property's timeline drawn.
"""

import copy
import json
import os

import pytest

import labkit.grading
from labkit.grading import grader, notebooks, verdicts

import answers
import corpus_part1
import corpus_part2

CORPUS = {**corpus_part1.CORPUS, **corpus_part2.CORPUS}
TASKS = sorted(CORPUS)
TAMPER = answers.TAMPER["rebinds check to print the pass line"]
ONLY = os.environ.get("LABKIT_TEST_TASKS")  # e.g. "02.1,02.2" while writing a check
EXERCISES = sorted((notebooks.ROOT / "exercises").glob("*.ipynb"))


def tasks_of(exercise: dict) -> list[str]:
    return [t for c in exercise["cells"] if (t := grader.task_of(c))]


def _answered(exercise: dict, pick, tamper: bool = False) -> dict:
    """Fill each task's answer cell (the code cell before its check) with ``pick(task)``, or
    leave the exercise's stub where it gives None."""
    nb = copy.deepcopy(exercise)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for before, cell in zip(code, code[1:]):
        if (tid := grader.task_of(cell)) is None or (answer := pick(tid)) is None:
            continue
        before["source"] = (TAMPER if tamper else "") + answer
        if tamper:
            line = cell["outputs"][0]["text"]
            cell["source"] = f"# NBVAL_CHECK_OUTPUT\nprint({''.join(line).strip()!r})"
    return nb


def _right(tid):
    return next(iter(CORPUS[tid]["right"].values()))


def _wrong(k: int):
    def pick(tid):
        wrong = list(CORPUS[tid]["wrong"].values())
        return wrong[k][0] if k < len(wrong) else None
    return pick


def cases(kind: str):
    return [pytest.param(t, label, id=f"{t}-{label}") for t in TASKS for label in CORPUS[t][kind]
            if not ONLY or t in ONLY.split(",")]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One grader run over the whole class, and ``--feedback``'s page for every student:
    ``{student: Submission}``, ``"pages"``: ``{student: html}``, ``"wrong"``: ``{(task, label):
    (student, Report)}`` for every wrong answer of the corpus."""
    root, wrong = tmp_path_factory.mktemp("submissions"), {}
    for path in EXERCISES:
        exercise, ex = json.loads(path.read_text()), path.stem[:2]
        tids = tasks_of(exercise)
        if ONLY and not set(tids) & set(ONLY.split(",")):
            continue
        students = [("right", _answered(exercise, _right)),
                    ("tampered", _answered(exercise, _wrong(0), tamper=True))]
        for k in range(max(len(CORPUS[t]["wrong"]) for t in tids)):
            students.append((f"wrong{k:02}", _answered(exercise, _wrong(k))))
            wrong |= {(t, list(CORPUS[t]["wrong"])[k]): f"wrong{k:02}-{ex}"
                      for t in tids if k < len(CORPUS[t]["wrong"])}
        for student, nb in students:
            folder = root / f"{student}-{ex}"
            folder.mkdir()
            (folder / path.name).write_text(json.dumps(nb))
    # one OS-drawn seed for every notebook: the tampered copy is judged on the wrong one's inputs
    subs = grader.grade([str(root)], cell_timeout=60, jobs=2, seed=verdicts.draw_seed())
    written = grader.write_feedback(subs, root.parent / "pages", jobs=2)  # one per core
    by = {s.student: s for s in subs}
    return by | {"pages": {p.stem: p.read_text() for p in written},
                 "wrong": {key: (s, by[s].results[key[0]]) for key, s in wrong.items()}}


def section(page: str, task_id: str) -> str:
    """The part of a feedback page about ``task_id``: from its heading to the next one."""
    head = f"<h3>task {task_id}:"
    assert page.count(head) == 1, task_id
    return page.split(head, 1)[1].split("<h3>task ", 1)[0]


def test_the_corpus_covers_every_task():
    """Every task of every exercise has right and wrong answers in the corpus."""
    tasks = {t for p in EXERCISES for t in tasks_of(json.loads(p.read_text()))}
    assert tasks and tasks <= set(CORPUS)


@pytest.mark.parametrize("exercise", [p.stem[:2] for p in EXERCISES])
def test_right_wrong_and_tampered_submissions(graded, exercise):
    """Right passes every task with full points; wrong and tampered fail every task, and the
    tampered copy of the wrong answers scores exactly what they score."""
    if f"right-{exercise}" not in graded:
        pytest.skip(f"LABKIT_TEST_TASKS={ONLY}")
    right, wrong, tampered = (graded[f"{s}-{exercise}"] for s in ("right", "wrong00", "tampered"))
    assert right.results and set(right.outcomes.values()) == {"pass"}, right
    assert set(wrong.results) == set(right.results) and set(wrong.outcomes.values()) == {"fail"}, wrong
    assert set(tampered.results) == set(right.results) and set(tampered.outcomes.values()) == {"fail"}, tampered
    points = {s.student: grader.totals([s])[s.student] for s in (right, wrong, tampered)}
    assert points[right.student][0] == points[right.student][1] > points[wrong.student][0], points
    assert points[tampered.student] == points[wrong.student], points  # tampering gains nothing


@pytest.mark.parametrize("task_id,label", cases("wrong"))
def test_known_wrong_answers_break_exactly_their_properties(graded, task_id, label):
    """A known-wrong answer breaks exactly the properties it is known to break, names each with
    its seed and replay call, and scores every other; a constant scores nothing."""
    (_, report), (_, phrase, props) = graded["wrong"][task_id, label], CORPUS[task_id]["wrong"][label]
    text = report.text()
    assert not report.passed and phrase in text, text
    if props is None:  # a constant
        assert report.total()[0] == 0, text
        return
    want = {props} if isinstance(props, str) else set(props)
    assert report.problem is None, text
    assert {f.prop for f in report.findings if not f.scored} == want, text
    assert all(f.broken for f in report.findings if f.prop in want), text
    for f in report.findings:
        if f.broken:
            assert f"seed {f.broken.seed}," in text and f.broken.replay(task_id, report.answer) in text


@pytest.mark.parametrize("task_id,label", cases("wrong"))
def test_every_wrong_answer_has_a_feedback_page_with_each_failure_drawn(graded, task_id, label):
    """The page ``--feedback`` wrote for the student who gave this wrong answer has a section for
    its task, with one picture for each broken property that logged a run, none left undrawn;
    its events keep their declared types (a token (epoch, n) is a tuple, never a JSON list)."""
    student, report = graded["wrong"][task_id, label]
    part = section(graded["pages"][student], task_id)
    drawn = [f for f in report.failed() if f.broken and f.broken.events]
    assert "could not be drawn" not in part and part.count('src="data:image/png') == len(drawn), part
    assert not any(isinstance(e.get("generation"), list) for f in drawn for e in f.broken.events)


def test_values_come_back_with_their_declared_types(graded):
    """A token (epoch, n) that a 04.1 answer used comes back from the judge as a tuple, never a
    JSON list, in every event of every failure."""
    tokens = [e["generation"] for s, sub in graded.items() if s.endswith("-04")
              for r in sub.results.values() for f in r.failed() if f.broken for e in f.broken.events]
    assert any(isinstance(t, tuple) for t in tokens) or ONLY
    assert not any(isinstance(t, list) for t in tokens)


@pytest.mark.parametrize("task_id,label", cases("wrong"))
def test_every_replay_line_draws_the_answers_run(graded, task_id, label):
    """Each replay line of a failure draws the failing run: a lane of the answer's own events,
    not only the fence's (run in this process, as a student's kernel does)."""
    from labkit.views.scene import lanes_of

    (_, report), entry = graded["wrong"][task_id, label], CORPUS[task_id]
    answer = answers.define(entry["wrong"][label][0], entry["name"])
    for f in report.failed():
        if f.broken and f.broken.seed is not None:
            result = labkit.grading.replayed(task_id, answer, seed=f.broken.seed, run=f.broken.run)
            assert lanes_of(result.history, 14), (f.prop, result.history)


def test_a_transaction_left_open_is_drawn_held_to_the_end_of_the_run(graded):
    """Wherever a wrong answer's failure says a call left its transaction open, the failure's
    events and its replay hold the write lock from that call to the end of the run: a held span
    with no release and no expiry, as the timeline draws it."""
    from labkit.grading.lab import LEFT_OPEN
    from labkit.sim.history import Event
    from labkit.views.scene import _intervals, end_of

    found = []
    for (task_id, label), (_, report) in graded["wrong"].items():
        for f in report.failed():
            if f.broken and "open" in f.broken.detail and "transaction" in f.broken.detail:
                answer = answers.define(CORPUS[task_id]["wrong"][label][0], CORPUS[task_id]["name"])
                for history in ([Event(**e) for e in f.broken.events],
                                labkit.grading.replayed(task_id, answer, seed=f.broken.seed, run=f.broken.run).history):
                    held = [e for e in history if e.action == "acquire" and e.target == LEFT_OPEN]
                    assert held, (task_id, label, f.prop, history)
                    mine = [e for e in history if e.worker == held[0].worker]
                    spans = _intervals(mine, end_of(history))[0]
                    assert any(a <= held[0].time and b == end_of(history) for a, b in spans), spans
                found.append((task_id, label))
    assert len({t for t, _ in found}) >= 3 or ONLY, found
