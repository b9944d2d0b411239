"""Feedback that teaches and never crashes (issue 26).

A cell that raises is named with its exception; a quiz's failure names the wrong pick, never the
key; ``replay`` returns nothing for a notebook to print; values keep their declared types across
JSON; one page (or one picture) that cannot be drawn stops no other page.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
from matplotlib.figure import Figure

import labkit.grading
from answers import define, judged
from corpus_part2 import CORPUS
from labkit.grading import judge, reports
from labkit.grading.grader import Submission
from labkit.grading.notebooks import ROOT
from labkit.grading.scores import Failure, Finding, Report
from labkit.sim.history import Event
from prerequisites import require_sandbox

RIGHT_05 = "def conservative_deadline(send_time, ttl, margin, max_drift):\n    return send_time + ttl * (1 - max_drift) - margin\n"


@pytest.mark.parametrize("cell,said", [
    ("import no_such_module_xyz\n" + RIGHT_05, "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    (RIGHT_05.replace("def conservative", "raise ValueError('half done')\ndef conservative"), "ValueError: half done"),
    (RIGHT_05.replace("):\n", ")\n"), "SyntaxError: expected ':'"),
])
def test_a_cell_that_raises_shows_its_exception_not_a_missing_function(cell, said):
    """The answer's cell raised, so its function was never defined: the report says what the
    cell raised, with the type and the message, and neither "defines no function" nor a frame."""
    require_sandbox()
    items = [("code", "import math\n"), ("code", cell), ("check", "05.1", "conservative_deadline")]
    report = judge.judge(items, {"05.1"}, timeout=20)["05.1"]
    text = report.text()
    assert report.total()[0] == 0 and said in text, text
    assert "defines no function" not in text and "File " not in text and "labkit/" not in text, text
    assert "the cell that begins" in text, text


def test_a_quiz_failure_names_the_wrong_pick_never_the_key():
    """For every wrong 09.1 answer of the corpus, each broken incident names the incident and
    the student's pick, and neither the mechanism it needs nor the key's reason."""
    require_sandbox()
    key = json.loads((ROOT / "solutions" / "keys.json").read_text())["09.1"]
    entry = CORPUS["09.1"]
    reports_ = judged("09.1", entry["name"], {label: src for label, (src, *_) in entry["wrong"].items()})
    seen = 0
    for label, report in reports_.items():
        text = report.text()
        assert not any(k["why"] in text for k in key.values()) and "needs the" not in text, text
        for f in report.findings:
            if f.broken and "gets the mechanism" in f.broken.rule:
                incident = f.broken.rule.split("'")[1]
                words = f.broken.rule + f.broken.detail
                assert key[incident]["mechanism"] not in words and " is not it" in words, (label, words)
                seen += 1
    assert seen >= len(entry["wrong"]) - 1  # every wrong pick but the one outside the list


def test_replay_returns_nothing_a_notebook_prints():
    """``replay(...)`` draws the run and returns None: no ``<Axes: ...>`` above the picture."""
    wrong = define(CORPUS["05.1"]["wrong"][next(iter(CORPUS["05.1"]["wrong"]))][0], "conservative_deadline")
    ax = Figure().add_subplot()
    assert labkit.grading.replay("05.1", wrong, seed=labkit.grading.TASKS["05.1"].schedules[0].seed, ax=ax) is None
    assert ax.collections or ax.lines  # it drew


def _failure(generation) -> Failure:
    events = [dataclasses.asdict(Event(1.0, "A", "write", "ok", generation, target="INV-1")),
              dataclasses.asdict(Event(2.0, "B", "write", "ok", (2, 1), target="INV-1"))]
    return Failure("a rule", "what it saw", "a schedule", 7, {"k": 1}, tuple(json.loads(json.dumps(events))))


def test_a_token_tuple_comes_back_a_tuple():
    """Across JSON (the judge's report) an (epoch, n) token is a tuple again, an int an int."""
    report = Report("04.1", "t", "issue", (Finding("p", "words", 0, _failure((1, 5))),))
    back = Report.from_json(json.loads(json.dumps(report.to_json())))
    gens = [e["generation"] for e in back.findings[0].broken.events]
    assert gens == [(1, 5), (2, 1)] and all(type(g) is tuple for g in gens)
    assert _failure(3).events[0]["generation"] == 3


def test_one_page_or_picture_that_cannot_be_drawn_stops_no_other(tmp_path, monkeypatch):
    """A picture that raises costs its picture (the page says so); a page that raises is written
    in words with the reason; every other student's page is drawn as usual."""
    def sub(student):
        report = Report("04.1", "t", "issue", (Finding("p", "words", 0, _failure((1, 5))),))
        return Submission(pathlib.Path(f"{student}.ipynb"), student, "04.ipynb", {"04.1": report})

    real_page, real_picture = reports.page, reports.picture
    monkeypatch.setattr(reports, "page", lambda s, *a: (_ for _ in ()).throw(KeyError("boom"))
                        if s == "bad" else real_page(s, *a))
    monkeypatch.setattr(reports, "picture", lambda task, words, f: (_ for _ in ()).throw(TypeError("odd"))
                        if words == "undrawable" else real_picture(task, words, f))
    subs = [sub("ann"), sub("bad"), sub("zed")]
    odd = Report("04.1", "t", "issue", (Finding("p", "undrawable", 0, _failure((1, 5))),))
    subs.append(Submission(pathlib.Path("odd.ipynb"), "odd", "04.ipynb", {"04.1": odd}))
    pages = {p.stem: p.read_text() for p in reports.write_feedback(subs, tmp_path)}
    assert set(pages) == {"ann", "bad", "zed", "odd"}
    assert all(pages[s].count('src="data:image/png') == 1 for s in ("ann", "zed"))
    assert "could not be drawn (KeyError: &#x27;boom&#x27;)" in pages["bad"] and "task 04.1: 0/10 points" in pages["bad"]
    assert "the timeline could not be drawn (TypeError: odd)" in pages["odd"] and "data:image" not in pages["odd"]
