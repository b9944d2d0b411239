"""The grader on exercise 05: canonical check cells come back, bad notebooks cost only their student.

Each student's notebook is the solution of exercise 05 with one change pasted in, the way a
student would leave it; the grader judges the file itself, never its stored outputs.
"""

import base64
import copy
import csv
import io
import json
import xml.etree.ElementTree as ET
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
    "partial": _with(FIRST + "    return send_time + ttl - ttl * max_drift\n"),  # forgets the margin
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
    assert graded[1]["right"].outcomes == {"05.1": "pass", "05.2": "pass"}


def test_constant_answer_fails_its_task_only(graded):
    """An answer that returns a constant fails its task and only its task, with its own note."""
    constant = graded[1]["constant"]
    assert constant.outcomes == {"05.1": "fail", "05.2": "pass"}
    assert set(constant.notes) == {"05.1"} and "(seed " in constant.notes["05.1"]


def test_tampered_check_cell_is_overridden(graded):
    """A check cell edited to print the pass line counts for nothing: the canonical cell is judged."""
    assert graded[1]["tampered"].outcomes == {"05.1": "fail", "05.2": "pass"}


def test_a_cell_that_never_ends_fails_every_later_check(graded):
    """A loop that never ends costs its own check and every later one, and says so."""
    loops = graded[1]["loops"]
    assert loops.outcomes == {"05.1": "fail", "05.2": "fail"}
    assert all("did not finish within 4 s" in loops.notes[t] for t in ("05.1", "05.2"))


def test_a_fork_bomb_and_a_full_disk_cost_nothing_else(graded):
    """A fork bomb hits the process limit and its cell never ends; 200 MB do not fit the
    answer's disk. Each costs its own tasks, graded beside the others, and leaves no process."""
    forks = graded[1]["forks"]
    assert forks.outcomes == {"05.1": "fail", "05.2": "fail"}
    assert "did not finish" in forks.notes["05.1"]
    assert graded[1]["fills-disk"].outcomes == {"05.1": "fail", "05.2": "pass"}
    disk = graded[1]["fills-disk"].notes["05.1"]  # the cell's own error, by name: no space, or too large
    assert "raised OSError: [Errno" in disk and ("No space left" in disk or "File too large" in disk), disk
    groups = pathlib.Path("/sys/fs/cgroup/pids").glob("labkit-judge-*")
    left = [g for g in groups if not pathlib.Path(f"/proc/{g.name.split('-')[2]}").exists()]
    assert not left, f"sandboxes outlived their judge: {left}"


def test_an_answer_that_exits_the_interpreter_fails(graded):
    """os._exit in a cell kills the answer's process: its tasks fail, grading goes on."""
    assert graded[1]["exits"].outcomes == {"05.1": "fail", "05.2": "fail"}


def test_unsolved_exercise_fails_its_checks(graded):
    """The generated exercise fails where the answers were stripped."""
    unsolved = graded[1]["unsolved"]
    assert unsolved.outcomes == {"05.1": "fail", "05.2": "fail"}
    assert "NotImplementedError" in unsolved.notes["05.1"]


@pytest.mark.parametrize("student,why", [("broken", "not a readable notebook"),
                                         ("huge", "over 5 MB"), ("untagged", "no task cells"),
                                         ("nested", "recursion"), ("linked", "not a regular file")])
def test_bad_notebooks_are_reported_for_that_student(graded, student, why):
    """Not JSON, over 5 MB, no task cells, nested too deep, or a link: failed with the reason."""
    sub = graded[1][student]
    assert set(sub.outcomes.values()) == {"fail"} and why in sub.problem, sub


def test_cli_writes_scorecard_junit_and_csv(graded, tmp_path):
    """The command line prints a scorecard with points and totals and the replay line of each broken
    property, exits 0, and writes a JUnit case per task with its points, and a CSV row per task."""
    subs = graded[0] / "subs"
    out = subprocess.run(
        [sys.executable, "-m", "labkit.grade", str(subs), "--only", "constant", "--jobs", "2",
         "--junit", str(tmp_path / "j.xml"), "--csv", str(tmp_path / "c.csv"),
         "--feedback", str(tmp_path / "pages")],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert rows[0][:4] == ["student", "05.1", "05.2", "total"]
    assert rows[1][:4] == ["constant", "0/10", "10/10", "10/20"]
    broken = [line for line in out.stdout.splitlines() if line.startswith("  constant 05.1: ")]
    seeded = [b for b in broken if "(seed " in b]
    assert seeded and all("labkit.grading.replay('05.1', conservative_deadline, seed=" in b for b in seeded)
    assert all("(seed " in b or ": never checked: " in b for b in broken), broken
    junit = (tmp_path / "j.xml").read_text()
    assert junit.count("<testcase") == 2 and junit.count("<failure") == 1 and "seed" in junit
    assert 'name="points" value="0/10"' in junit and 'name="points" value="10/10"' in junit
    lines = (tmp_path / "c.csv").read_text().splitlines()
    assert lines[0].endswith(",total,total_possible") and all(line.endswith(",10,20") for line in lines[1:]), lines
    page = (tmp_path / "pages" / "constant.html").read_text()
    assert "constant: 10/20 points" in page and page.count("data:image/png;base64,") == len(seeded)


def test_the_run_seed_is_recorded_and_replays_the_run(graded, tmp_path):
    """Without --seed each run draws its seed from the OS and every CSV row records it; with
    --seed N the rows say N, the replay calls name run=N, and two runs write the same CSV."""
    subs, tables = graded[0] / "subs", []
    for name, seed in [("drawn", []), ("a", ["--seed", "4242"]), ("b", ["--seed", "4242"])]:
        out = subprocess.run([sys.executable, "-m", "labkit.grade", str(subs), "--only", "partial",
                              "--csv", str(tmp_path / f"{name}.csv"), *seed],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        tables.append(list(csv.DictReader((tmp_path / f"{name}.csv").open())))
        assert not seed or "run=4242)" in out.stdout, out.stdout
    drawn, a, b = tables
    assert all(r["seed"].isdigit() for r in drawn) and len({r["seed"] for r in drawn}) == 1, drawn
    assert {r["seed"] for r in a} == {"4242"} and a == b, (a, b)
    assert [r["points"] for r in drawn] == [r["points"] for r in a], (drawn, a)


def test_a_partly_right_answer_scores_the_properties_it_keeps(graded):
    """Forgetting the margin breaks some of 05.1's properties, not all: the others score."""
    report = graded[1]["partial"].results["05.1"]
    got, possible = report.total()
    assert 0 < got < possible == 10, report.text()
    assert any(f.scored for f in report.findings) and any(f.broken for f in report.findings)


def _png_colours(uri: str) -> int:
    import matplotlib.image

    assert uri.startswith("data:image/png;base64,")
    pixels = matplotlib.image.imread(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])), format="png")
    return len({tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::7]})


def test_the_whole_class_csv_junit_and_feedback_pages(graded, tmp_path):
    """For the whole class: the CSV's totals are the sums of each student's rows, every note and
    JUnit message speaks of its own task, and each student's feedback page shows the timeline of
    each failing run as an embedded image (a sample is kept in build/feedback/)."""
    subs = list(graded[1].values())
    grader.write_csv(subs, tmp_path / "c.csv")
    grader.write_junit(subs, tmp_path / "j.xml")
    rows = list(csv.DictReader((tmp_path / "c.csv").open()))
    for student in graded[1]:
        mine = [r for r in rows if r["student"] == student]
        assert mine and {r["total"] for r in mine} == {f"{sum(float(r['points']) for r in mine):g}"}
        assert {r["total_possible"] for r in mine} == {"20"}, mine
    for r in rows:
        other = "05.2" if r["task"] == "05.1" else "05.1"
        assert f"replay('{other}'" not in r["failed"] and (r["outcome"] == "pass") == (r["points"] == "10")
        for item in filter(None, r["failed"].split(" | ")):  # a seeded failure replays its task
            assert "(seed " not in item or f"labkit.grading.replay('{r['task']}', " in item, r
    cases = ET.parse(tmp_path / "j.xml").getroot().findall("testcase")
    for case in cases:
        failure, tid = case.find("failure"), case.get("name").removeprefix("task ")
        if failure is not None and case.get("name").startswith("task "):
            assert failure.get("message").startswith(f"task {tid}: "), failure.get("message")
            other = "05.2" if tid == "05.1" else "05.1"
            assert f"replay('{other}'" not in failure.get("message") + (failure.text or "")
    from labkit.grading import PROBLEMS

    folder = notebooks.ROOT / "build" / "feedback"
    pages = {p.stem: p.read_text() for p in grader.write_feedback(subs, folder)}
    assert set(pages) == {s.student for s in subs}
    for sub in subs:
        failing = [f for r in sub.results.values() for f in r.failed() if f.broken and f.broken.seed is not None]
        assert all(f.broken.events for f in failing if f.prop not in PROBLEMS), sub.student
        images = [chunk.split('"', 1)[0] for chunk in pages[sub.student].split('src="')[1:]]
        assert len(images) == sum(bool(f.broken.events) for f in failing), sub.student
        assert all(_png_colours(uri) > 3 for uri in images), sub.student  # a drawing, not a blank
    assert "partial" in pages and 'alt="the timeline of seed' in pages["partial"]
    partial = next(r for r in rows if r["student"] == "partial" and r["task"] == "05.1")
    assert 0 < float(partial["points"]) < 10 and "(seed " in partial["failed"], partial


def test_points_file_weights_properties_and_is_checked(graded, tmp_path, capsys):
    """``--points`` gives a task's properties their own points; a task or property that does not
    exist, or a negative number, is refused before anything is graded."""
    from labkit import BadArgument
    from labkit.grading import TASKS

    props = list(TASKS["05.1"].properties)
    good = tmp_path / "points.json"
    good.write_text(json.dumps({"05.1": {props[0]: 7, **{p: 1 for p in props[1:]}}, "05.2": 5}))
    points = grader.load_points(good)
    report = graded[1]["right"].results["05.1"]
    assert report.total(points["05.1"]) == (6.0 + len(props), 6.0 + len(props))
    assert graded[1]["right"].results["05.2"].total(points["05.2"]) == (5.0, 5.0)
    assert grader.totals([graded[1]["right"]], points) == {"right": (11.0 + len(props), 11.0 + len(props))}
    (tmp_path / "some.json").write_text(json.dumps({"05.1": {props[0]: 3}}))
    assert graded[1]["right"].results["05.1"].total(grader.load_points(tmp_path / "some.json")["05.1"]) == (3, 3)
    assert f"task 05.1's {sorted(props[1:])} no points" in capsys.readouterr().err
    for bad, word in [({"99.9": 3}, "no task"), ({"05.1": {"nope": 1}}, "no property"), ({"05.1": -1}, ">= 0")]:
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(BadArgument, match=word):
            grader.load_points(tmp_path / "bad.json")
    out = subprocess.run([sys.executable, "-m", "labkit.grade", str(tmp_path), "--points", str(tmp_path / "bad.json")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--points" in out.stderr and "grading" not in out.stderr
