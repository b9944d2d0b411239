"""Points per property, read back the way the check cell, the CSV and the feedback page read them."""

import contextlib
import csv
import json
import pathlib

import labkit.grading
from answers import define
from corpus_part2 import CORPUS
from labkit.grading import grader, reports
from labkit.grading.scores import Failure, Finding, Report, shown_points


def _verdict(task_id: str, source: str) -> Report:
    name = CORPUS[task_id]["name"]
    answer = define(source, name)
    return labkit.grading.verdict(task_id, lambda: contextlib.nullcontext(answer), name)


def test_a_report_comes_back_from_json_as_it_left():
    """The judge sends a Report as JSON: what the check cell shows is what the grader shows (05.2's
    knobs hold tuples; they read the same on both sides)."""
    label = next(k for k, (_, _, props) in CORPUS["05.2"]["wrong"].items() if props is not None)
    report = _verdict("05.2", CORPUS["05.2"]["wrong"][label][0])
    again = Report.from_json(json.loads(json.dumps(report.to_json())))
    assert not report.passed and again == report and again.text() == report.text()


def test_a_trial_that_finds_the_answer_cannot_run_scores_nothing_and_says_why():
    """08.2's trial itself finds a surprise (the answer raised after its fenced commit): the task
    scores 0 with the reason, and the judge does not fail the notebook's other tasks."""
    right = next(iter(CORPUS["08.2"]["right"].values()))
    report = _verdict("08.2", right.replace("    return True\n", "    raise ValueError('late')\n", 1))
    assert report.problem is not None and report.total()[0] == 0, report.text()
    assert "no points until" in report.text()


def test_points_read_plainly():
    assert [shown_points(x) for x in (10, 2.5, 10 / 3, 1234567, 0.0)] == ["10", "2.5", "3.33", "1234567", "0"]


def _report(problem=None) -> Report:
    broken = Failure("the rule", "what it saw", "a schedule", 3, {"pause": [1, 2]},
                     ({"time": 1.0, "worker": "A", "action": "write", "outcome": "ok"},))
    found = (Finding("kept", "a property it kept", 4), Finding("lost", "a property it broke", 1, broken))
    return Report("05.1", "a title", "answer", found, problem)


def test_a_crashed_answer_shows_no_property_as_held():
    """Once the answer could not run, a property that held earlier is 'not scored', in the text
    and on the page alike."""
    crash = Finding("runs", "the answer runs", 0, Failure("", "ValueError: late", "s", 5, {}))
    report = _report(crash)
    assert "not scored [kept]" in report.text() and "held" not in report.text()
    page = reports.page("a", [("nb", [report], None)])
    assert "<b>not scored</b> [kept]" in page and "<b>held</b>" not in page


def test_feedback_pages_survive_odd_events_and_names(tmp_path):
    """An event time of inf (an answer's odd value) draws no picture but breaks no page; two
    students whose names look alike get a page each."""
    report = _report()
    odd = Failure("r", "d", "s", 1, {}, ({"time": float("inf"), "worker": "A", "action": "write",
                                         "outcome": "ok"},))
    bad = Report("05.1", "t", "answer", (Finding("lost", "a property it broke", 0, odd),))
    pages = reports.write_pages({"a b": [("nb", [report], None)], "a_b": [("nb", [bad], None)]}, tmp_path)
    assert [p.name for p in pages] == ["a_b.html", "a_b-2.html"]
    assert pages[0].read_text().count("data:image/png;base64,") == 1
    assert "data:image/png" not in pages[1].read_text() and "what it saw" not in pages[1].read_text()


def test_the_csv_keeps_a_crash_seed_and_a_student_whose_notebook_matched_nothing(tmp_path):
    crash = Finding("runs", "the answer runs", 0, Failure("", "ValueError: late", "s", 5, {}))
    crashed = grader.Submission(pathlib.Path("x/05.ipynb"), "ann", "05.ipynb", {"05.1": _report(crash)})
    lost = grader.Submission(pathlib.Path("y/notes.ipynb"), "bob", None, {}, "matches no exercise")
    grader.write_csv([crashed, lost], tmp_path / "c.csv")
    rows = list(csv.DictReader((tmp_path / "c.csv").open()))
    assert "labkit.grading.replay('05.1', answer, seed=5)" in rows[0]["failed"], rows[0]
    assert rows[1]["student"] == "bob" and rows[1]["note"] == "matches no exercise", rows[1]
    page = reports.write_pages({"bob": [("notes.ipynb", [], "matches no exercise")]}, tmp_path)[0]
    assert "matches no exercise" in page.read_text()
