"""One notebook cannot stop the batch: its judge runs in a process of its own (issue 22).

The judge of a marked notebook is killed by a signal (SIGKILL, SIGTERM, a real segmentation
fault) or hangs past the notebook's time limit; that notebook scores 0 and says why, and every
other notebook of the batch keeps exactly the grade it gets in a batch without them.
"""

import copy
import csv
import json
import os
import signal
import xml.etree.ElementTree as ET

import pytest

from labkit.grading import grader, notebooks, verdicts

SOLUTION = json.loads((notebooks.ROOT / "solutions" / "05-late-renewal.ipynb").read_text())
FIRST = "def conservative_deadline(send_time, ttl, margin, max_drift):\n"


def _with(answer: str) -> dict:
    nb = copy.deepcopy(SOLUTION)
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code" and c["source"].startswith(FIRST))
    cell["source"] = answer
    return nb


GOOD = {
    "right": _with(FIRST + "    return send_time + ttl - ttl * max_drift - margin\n"),
    "partial": _with(FIRST + "    return send_time + ttl - ttl * max_drift\n"),  # forgets the margin
}
DOOMED = {f"dies-{how}": _with(f"# JUDGE-DIES {how}\n" + FIRST + "    return 0.0\n")
          for how in ("SIGKILL", "SIGTERM", "segfault", "hangs")}
DOOMED["dies-hangs"]["cells"].insert(0, {"cell_type": "code", "source": "pass", "metadata": {},
                                         "outputs": [], "execution_count": None})
HANGS = sum(c["cell_type"] == "code" for c in DOOMED["dies-hangs"]["cells"])  # its cells, and no other's


def _doomed_judge(real):
    """The judge, but it dies (or hangs) on a notebook that asks for it: in the judge's process."""
    def judge_here(job, cells):
        marks = [c.split()[2] for c in cells if c.startswith("# JUDGE-DIES ")]
        if marks and marks[0] == "segfault":  # a real one: a read of address 0
            import ctypes
            import faulthandler
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            faulthandler.disable()
            ctypes.string_at(0)
        if marks and marks[0] == "hangs":
            signal.pause()
        if marks:
            os.kill(os.getpid(), getattr(signal, marks[0]))
        return real(job, cells)
    return judge_here


def _write(root, students: dict):
    for name, nb in students.items():
        (root / name).mkdir()
        (root / name / "05-late-renewal.ipynb").write_text(json.dumps(nb))


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    """The good notebooks alone, then with the doomed ones (judged 2 at once; the one that hangs
    has a 4 s limit), and the CSV and JUnit files of that batch."""
    alone = tmp_path_factory.mktemp("alone")
    _write(alone, GOOD)
    seed = verdicts.draw_seed()  # one seed, drawn from the OS, for both batches: the same grades
    baseline = {s.student: s for s in grader.grade([str(alone)], jobs=2, seed=seed)}
    mixed = tmp_path_factory.mktemp("mixed")
    _write(mixed, {**GOOD, **DOOMED})
    out = tmp_path_factory.mktemp("out")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grader, "_judge_here", _doomed_judge(grader._judge_here))
        real = grader.notebook_limit
        mp.setattr(grader, "notebook_limit", lambda cells, *rest: 4.0 if cells == HANGS else real(cells, *rest))
        subs = grader.grade([str(mixed)], jobs=2, seed=seed)
    grader.write_csv(subs, out / "g.csv")
    grader.write_junit(subs, out / "g.xml")
    return baseline, {s.student: s for s in subs}, out


def test_a_dead_judge_costs_its_notebook_only(batches):
    """Each notebook whose judge died scores 0 on every task and says to look at it by hand;
    the others keep exactly the reports they get without the doomed ones."""
    baseline, mixed, _ = batches
    assert baseline["right"].outcomes == {"05.1": "pass", "05.2": "pass"}
    assert baseline["partial"].outcomes["05.1"] == "fail"
    for name in GOOD:
        assert mixed[name].results == baseline[name].results, name
    for name in DOOMED:
        sub = mixed[name]
        assert set(sub.results) == {"05.1", "05.2"}
        for report in sub.results.values():
            assert report.total()[0] == 0
            why = "did not finish this notebook" if name == "dies-hangs" else grader.CRASHED
            assert why in report.text() and "look at it by hand" in report.text(), report.text()


def test_the_outputs_are_written_for_everyone(batches):
    """With dead judges in the batch, the CSV and the JUnit file still hold every student."""
    baseline, _, out = batches
    rows = {r["student"]: r for r in csv.DictReader((out / "g.csv").open())}
    assert set(GOOD) | set(DOOMED) <= set(rows), rows
    junit = (out / "g.xml").read_text()
    assert all(name in junit for name in [*GOOD, *DOOMED])
    ET.fromstring(junit)
