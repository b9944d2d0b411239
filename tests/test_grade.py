"""The grader on exercise 05: canonical check cells come back, bad notebooks cost only their student.

Each student's notebook is the solution of exercise 05 with one change pasted in, the way a
student would leave it; the grader judges the file itself, never its stored outputs.
"""

import copy
import json
import pathlib
import subprocess
import sys

import pytest

from labkit.grading import grader, notebooks

SOLUTION = json.loads((notebooks.ROOT / "solutions" / "05-late-renewal.ipynb").read_text())
EXERCISE = json.loads((notebooks.ROOT / "exercises" / "05-late-renewal.ipynb").read_text())
FIRST = "def conservative_deadline(send_time, ttl, margin, max_drift):\n"


def _with(first_answer: str | None = None, *, check=None, strip_tags=False, pad=0) -> dict:
    """The solution with the 05.1 answer cell replaced, the 05.1 check cell edited, ..."""
    nb = copy.deepcopy(SOLUTION)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    if first_answer is not None:
        next(c for c in code if c["source"].startswith(FIRST))["source"] = first_answer
    if check is not None:
        cell = next(c for c in code if "task:05.1" in c["metadata"].get("tags", []))
        cell["source"] = f"# NBVAL_CHECK_OUTPUT\n{check}"
    for cell in nb["cells"] if strip_tags else ():
        cell.get("metadata", {}).pop("tags", None)
    if pad:
        nb["metadata"]["padding"] = "x" * pad
    return nb


STUDENTS = {
    "right": _with(FIRST + "    return send_time + ttl - ttl * max_drift - margin\n"),
    "constant": _with(FIRST + "    return 0.0\n"),
    "tampered": _with(FIRST + "    return 0.0\n", check='print("PASS 05.1: the conservative local '
                      'deadline held under every schedule")'),
    "loops": _with("while True:\n    pass\n"),
    "forks": _with("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                   "        pass\n"),
    "fills-disk": _with("open('/tmp/big', 'wb').write(b'x' * (200 << 20))\n" + FIRST + "    return 1.0\n"),
    "exits": _with("import os\nos._exit(3)\n"),
    "untagged": _with(strip_tags=True),
    "huge": _with(pad=6 << 20),
    "unsolved": EXERCISE,
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade every student once, two notebooks at a time."""
    root = tmp_path_factory.mktemp("grading")
    for student, nb in STUDENTS.items():
        (root / "subs" / student).mkdir(parents=True)
        (root / "subs" / student / "05-late-renewal.ipynb").write_text(json.dumps(nb))
    (root / "subs" / "broken").mkdir()
    (root / "subs" / "broken" / "05-late-renewal.ipynb").write_text("{not json")
    (root / "subs" / "nested").mkdir()  # JSON nested past Python's recursion limit
    (root / "subs" / "nested" / "05-late-renewal.ipynb").write_text("[" * 100_000)
    (root / "subs" / "linked").mkdir()  # a link to the solution itself
    (root / "subs" / "linked" / "05-late-renewal.ipynb").symlink_to(
        notebooks.ROOT / "solutions" / "05-late-renewal.ipynb")
    results = grader.grade([str(root / "subs")], cell_timeout=4, jobs=2)
    return root, {s.student: s for s in results}


def test_right_answer_passes_every_task(graded):
    """A correct answer in another style passes both tasks."""
    assert graded[1]["right"].results == {"05.1": "pass", "05.2": "pass"}


def test_constant_answer_fails_its_task_only(graded):
    """An answer that returns a constant fails its task and only its task, with its own note."""
    constant = graded[1]["constant"]
    assert constant.results == {"05.1": "fail", "05.2": "pass"}
    assert set(constant.notes) == {"05.1"} and "(seed " in constant.notes["05.1"]


def test_tampered_check_cell_is_overridden(graded):
    """A check cell edited to print the pass line counts for nothing: the canonical cell is judged."""
    assert graded[1]["tampered"].results == {"05.1": "fail", "05.2": "pass"}


def test_a_cell_that_never_ends_fails_every_later_check(graded):
    """A loop that never ends costs its own check and every later one, and says so."""
    loops = graded[1]["loops"]
    assert loops.results == {"05.1": "fail", "05.2": "fail"}
    assert all("did not finish within 4 s" in loops.notes[t] for t in ("05.1", "05.2"))


def test_a_fork_bomb_and_a_full_disk_cost_nothing_else(graded):
    """A fork bomb hits the process limit and its cell never ends; 200 MB do not fit the
    answer's disk. Each costs its own tasks, graded beside the others, and leaves no process."""
    forks = graded[1]["forks"]
    assert forks.results == {"05.1": "fail", "05.2": "fail"}
    assert "did not finish" in forks.notes["05.1"]
    assert graded[1]["fills-disk"].results == {"05.1": "fail", "05.2": "pass"}
    assert "No space left" in graded[1]["fills-disk"].notes["05.1"] or "defines no" in graded[1]["fills-disk"].notes["05.1"]
    groups = pathlib.Path("/sys/fs/cgroup/pids").glob("labkit-judge-*")
    left = [g for g in groups if not pathlib.Path(f"/proc/{g.name.split('-')[2]}").exists()]
    assert not left, f"sandboxes outlived their judge: {left}"


def test_an_answer_that_exits_the_interpreter_fails(graded):
    """os._exit in a cell kills the answer's process: its tasks fail, grading goes on."""
    assert graded[1]["exits"].results == {"05.1": "fail", "05.2": "fail"}


def test_unsolved_exercise_fails_its_checks(graded):
    """The generated exercise fails where the answers were stripped."""
    unsolved = graded[1]["unsolved"]
    assert unsolved.results == {"05.1": "fail", "05.2": "fail"}
    assert "NotImplementedError" in unsolved.notes["05.1"]


@pytest.mark.parametrize("student,why", [("broken", "not a readable notebook"),
                                         ("huge", "over 5 MB"), ("untagged", "no task cells"),
                                         ("nested", "recursion"), ("linked", "not a regular file")])
def test_bad_notebooks_are_reported_for_that_student(graded, student, why):
    """Not JSON, over 5 MB, no task cells, nested too deep, or a link: failed with the reason."""
    sub = graded[1][student]
    assert set(sub.results.values()) == {"fail"} and why in sub.problem, sub


def test_cli_writes_scorecard_junit_and_csv(graded, tmp_path):
    """The command line prints a scorecard with totals, exits 0, and writes a JUnit case per task."""
    subs = graded[0] / "subs"
    out = subprocess.run(
        [sys.executable, "-m", "labkit.grade", str(subs), "--only", "constant", "--jobs", "2",
         "--junit", str(tmp_path / "j.xml"), "--csv", str(tmp_path / "c.csv")],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert rows[0][:4] == ["student", "05.1", "05.2", "total"]
    assert [r[:4] for r in rows[1:]] == [["constant", "fail", "pass", "1"]]
    junit = (tmp_path / "j.xml").read_text()
    assert junit.count("<testcase") == 2 and junit.count("<failure") == 1 and "seed" in junit
    lines = (tmp_path / "c.csv").read_text().splitlines()
    assert lines[0].endswith(",total") and all(line.endswith(",1") for line in lines[1:]), lines
