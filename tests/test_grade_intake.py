"""Intake (issue 26): whose a notebook is, which files are refused and why, and names escaped.

One class, graded once by the command line with every output: a student is the first folder
under the submissions root; links, devices, pipes and names with control characters are
refused, each with its line in the scorecard; a second copy of an exercise is refused and names
the copy graded; every name is escaped in the scorecard, the CSV, the JUnit file and the pages.
"""

from __future__ import annotations

import csv
import os
import shutil
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from labkit.grading import notebooks
from prerequisites import require_sandbox

SOLUTION = notebooks.ROOT / "solutions" / "09-review.ipynb"
NAME = SOLUTION.name
FORGER = "eve\nmallory           10 of 10"  # a folder name that would forge a scorecard row
BIDI = "rtl\u202eevil"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade the class once: the scorecard (stdout), the CSV, the JUnit file and the pages."""
    require_sandbox()
    tmp = tmp_path_factory.mktemp("intake")
    root = tmp / "subs"

    def put(rel: str):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOLUTION, path)
        return path

    put(f"friend/me/{NAME}")  # a friend's folder holding "my" notebook: it is the friend's
    put(f"ann/{NAME}")
    put(f"ann/again/{NAME}")  # a second copy of the same exercise from ann
    kept = put(f"outside/{NAME}")
    (root / "linker").mkdir()
    os.link(kept, root / "linker" / NAME)  # a hard link to another's notebook
    (root / "symlinker").mkdir()
    (root / "symlinker" / NAME).symlink_to(SOLUTION)
    (root / "folderlink").symlink_to(root / "ann", target_is_directory=True)
    (root / "device").mkdir()
    os.mknod(root / "device" / NAME, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's
    (root / "pipe").mkdir()
    os.mkfifo(root / "pipe" / NAME)
    put(f"{FORGER}/{NAME}")
    put(f"{BIDI}/{NAME}")
    put(f"=HYPERLINK(1)/{NAME}")  # a name a spreadsheet would run
    put(f"<i>ital<i>/{NAME}")  # a name that is HTML
    out = subprocess.run(
        [sys.executable, "-m", "labkit.grade", str(root), "--csv", str(tmp / "c.csv"),
         "--junit", str(tmp / "j.xml"), "--feedback", str(tmp / "pages")],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return {"root": root, "scorecard": out.stdout, "csv": list(csv.DictReader((tmp / "c.csv").open())),
            "junit": (tmp / "j.xml").read_text(), "pages": {p.name: p.read_text() for p in (tmp / "pages").iterdir()}}


def _rows(graded, student: str) -> list[str]:
    return [line[len(student):] for line in graded["scorecard"].splitlines() if line.startswith(student + " ")]


def _csv(graded, student: str) -> list[dict]:
    return [r for r in graded["csv"] if r["student"] == student]


def test_a_student_is_the_first_folder_under_the_root(graded):
    """``friend/me/09.ipynb`` is graded as friend's; "me" is nobody's name."""
    assert [r["points"] for r in _csv(graded, "friend")] == ["10"]
    assert not _csv(graded, "me") and not _rows(graded, "me")


def test_a_hard_link_is_refused_and_says_why(graded):
    """A second name of another student's file scores nothing: "hard link" on its row."""
    (row,) = _rows(graded, "linker")
    assert "hard link" in row and row.split()[1] == "0/10", row
    assert [r["points"] for r in _csv(graded, "outside")] == ["0"]  # its other name: refused too


def test_a_symbolic_link_to_a_notebook_is_refused_and_says_why(graded):
    """A link to the solution is not followed: "symbolic link" on its row, 0 points."""
    (row,) = _rows(graded, "symlinker")
    assert "symbolic link" in row and row.split()[1] == "0/10", row


def test_a_symbolic_link_to_a_folder_is_not_followed_and_says_why(graded):
    """A link to ann's folder is listed with its reason and grades none of ann's work twice."""
    (row,) = _rows(graded, "folderlink")
    assert "symbolic link to a folder" in row and "10/10" not in row, row


@pytest.mark.parametrize("student", ["device", "pipe"])
def test_a_device_file_or_a_pipe_is_refused_and_says_why(graded, student):
    """A character device or a FIFO named like a notebook is refused at once (no read blocks)."""
    (row,) = _rows(graded, student)
    assert "device file, a pipe or a socket" in row and row.split()[1] == "0/10", row


def test_a_name_with_control_characters_is_refused_and_forges_no_line(graded):
    """A folder whose name holds a newline (or a bidirectional override) is refused, its name
    shown escaped on one line: no row of "mallory" appears, and no output holds the raw name."""
    forger = FORGER.encode("unicode_escape").decode()
    (row,) = _rows(graded, forger)
    assert "control character" in row and row.split()[1] == "0/10", row
    assert not any(line.startswith("mallory") for line in graded["scorecard"].splitlines())
    (bidi,) = _rows(graded, "rtl\\u202eevil")
    assert "control character" in bidi


def test_a_second_notebook_of_one_exercise_is_refused_and_names_the_one_graded(graded):
    """ann's two copies of 09: the first in path order is graded, the other is refused, its line
    names the graded copy, and ann's total counts one notebook's points."""
    rows = _csv(graded, "ann")
    assert len(rows) == 2 and {r["total_possible"] for r in rows} == {"10"}, rows
    graded_row, refused = sorted(rows, key=lambda r: r["task"] == "")
    assert graded_row["points"] == "10" and refused["task"] == ""
    assert f"graded {graded['root'] / 'ann' / NAME}" in refused["note"], refused
    assert any("second notebook" in row and str(graded["root"] / "ann" / NAME) in row
               for row in _rows(graded, "ann"))


def test_every_name_is_escaped_in_every_output(graded):
    """No output holds a raw control character; the JUnit file parses; the CSV's cells cannot be
    run by a spreadsheet; each page shows the escaped name, and the HTML escapes what it shows."""
    raw = [c for c in FORGER + BIDI if not c.isprintable()]
    outputs = {"scorecard": graded["scorecard"], "junit": graded["junit"], **graded["pages"],
               "csv": "".join(str(v) for r in graded["csv"] for v in r.values())}
    for name, text in outputs.items():
        lines = text if name == "scorecard" else text.replace("\n", "")
        assert not any(c in lines.replace("\n", "") for c in raw), name
    ET.fromstring(graded["junit"])
    assert "'=HYPERLINK(1)" in {r["student"] for r in graded["csv"]}
    assert not any(r["student"].startswith("=") for r in graded["csv"])
    page = next(p for n, p in graded["pages"].items() if n.startswith("eve"))
    assert "<h1>eve\\nmallory           10 of 10: 0/10 points</h1>" in page
    html = next(p for n, p in graded["pages"].items() if "ital" in n)
    assert "<h1>&lt;i&gt;ital&lt;i&gt;: 10/10 points</h1>" in html and "<i>" not in html
