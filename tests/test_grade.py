"""The grader: canonical check cells come back, bad notebooks cost only their student."""

import json
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from labkit.grading import grader, notebooks


def _check(task, test):
    cell = new_code_cell(f'# NBVAL_CHECK_OUTPUT\nassert {test}\nprint("PASS {task}")',
                         metadata={"tags": [f"task:{task}"]}, execution_count=1)
    cell.outputs = [new_output("stream", name="stdout", text=f"PASS {task}\n")]
    return cell


def _notebook(square, plus_one="return x + 1", check=None):
    cells = [new_markdown_cell("# demo"),
             new_code_cell(f"def square(x):\n    {square}"),
             check or _check("99.1", "square(3) == 9 and square(-4) == 16"),
             new_code_cell(f"def plus_one(x):\n    {plus_one}"),
             _check("99.2", "plus_one(1) == 2")]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade six students' submissions of one synthetic exercise, once."""
    root = tmp_path_factory.mktemp("grading")
    (root / "solutions").mkdir()
    nbformat.write(_notebook("### BEGIN SOLUTION\n    return x * x\n    ### END SOLUTION"),
                   root / "solutions" / "99-demo.ipynb")
    subs = {
        "right": _notebook("return x ** 2"),
        "constant": _notebook("return 9"),
        "tampered": _notebook("return 9", check=_check("99.1", "True")),
        "loops": _notebook("while True: pass"),
        "unsolved": nbformat.reads(json.dumps(notebooks.exercise_from_solution(
            json.loads((root / "solutions" / "99-demo.ipynb").read_text()))), as_version=4),
    }
    for student, nb in subs.items():
        (root / "subs" / student).mkdir(parents=True)
        nbformat.write(nb, root / "subs" / student / "99-demo.ipynb")
    (root / "subs" / "broken").mkdir()
    (root / "subs" / "broken" / "99-demo.ipynb").write_text("{not json")
    results = grader.grade([str(root / "subs")], solutions=root / "solutions", cell_timeout=5)
    return root, {s.student: s for s in results}


def test_right_answer_passes_every_task(graded):
    """A correct answer in another style passes both tasks."""
    assert graded[1]["right"].results == {"99.1": "pass", "99.2": "pass"}


def test_constant_answer_fails(graded):
    """An answer that returns a constant fails its task and only its task."""
    assert graded[1]["constant"].results == {"99.1": "fail", "99.2": "pass"}


def test_tampered_check_cell_is_overridden(graded):
    """A student's edit to a check cell counts for nothing: the canonical cell runs."""
    assert graded[1]["tampered"].results == {"99.1": "fail", "99.2": "pass"}


def test_timeout_fails_every_later_check(graded):
    """A loop that never ends costs its own check and every later one (not xfail)."""
    assert graded[1]["loops"].results == {"99.1": "fail", "99.2": "fail"}


def test_unsolved_exercise_fails_its_checks(graded):
    """The generated exercise fails where the answer was stripped."""
    assert graded[1]["unsolved"].results == {"99.1": "fail", "99.2": "pass"}


def test_invalid_notebook_is_reported_for_that_student(graded):
    """A file that is not JSON is reported, and grading goes on with the others."""
    broken = graded[1]["broken"]
    assert broken.results == {"99.1": "fail", "99.2": "fail"}
    assert "not a readable notebook" in broken.problem


def test_cli_writes_scorecard_junit_and_csv(graded, tmp_path):
    """The command line prints a scorecard, exits 0, and writes one JUnit case per task."""
    root = graded[0]
    out = subprocess.run(
        [sys.executable, "-m", "labkit.grade", str(root / "subs" / "right" / "99-demo.ipynb"),
         str(root / "subs" / "constant" / "99-demo.ipynb"),
         "--solutions", str(root / "solutions"), "--junit", str(tmp_path / "j.xml"),
         "--csv", str(tmp_path / "c.csv")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert rows[0][:3] == ["student", "99.1", "99.2"]
    assert sorted(r[:3] for r in rows[1:]) == [["constant", "fail", "pass"], ["right", "pass", "pass"]]
    junit = (tmp_path / "j.xml").read_text()
    assert junit.count("<testcase") == 4 and junit.count("<failure") == 1
    assert (tmp_path / "c.csv").read_text().count("\n") == 5
