"""The student release (issue 26): everything a student needs, nothing that answers a task.

The release is built once, from this checkout. It is searched for every solution block's text
and every answer key's text, in the folder and in the zip, and none is found; no stored output
shows a full-points scorecard. From inside it, ``make lab`` serves the release (until the server
answers, then it is stopped), and a check cell of an exercise judges an answer with the
release's own labkit; a quiz's check cell says the grader scores it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import urllib.request
import zipfile

import nbformat
import pytest
from kernels import Client as NotebookClient

from labkit.course.release import QUIZ_SAYS, release
from labkit.grading.notebooks import _BLOCK, ROOT, cell_source
from polling import wait_for
from prerequisites import require_sandbox
from test_make_lab import status, status_or_none

KEYS = json.loads((ROOT / "solutions" / "keys.json").read_text())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The release folder and zip, and the text of every file in each."""
    folder, archive = release(tmp_path_factory.mktemp("out") / "labkit-student")
    files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    with zipfile.ZipFile(archive) as z:
        zipped = {n.split("/", 1)[1]: z.read(n) for n in z.namelist() if not n.endswith("/")}
    return folder, files, zipped


def _blocks() -> list[str]:
    """The text of every solution block (between BEGIN and END SOLUTION) of every solution."""
    found = []
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            for m in _BLOCK.finditer(cell_source(cell)):
                found.append(m.group(0).split("\n", 1)[1].rsplit("### END SOLUTION", 1)[0].strip())
    return [b for b in found if b]


def _secrets() -> list[str]:
    """Every text of the answer keys: each reason and hint, each answer as a key/value pair."""
    out = [v["why"] for v in KEYS["09.1"].values()] + list(KEYS["03.2"]["hints"].values())
    pairs = [(i, v["mechanism"]) for i, v in KEYS["09.1"].items()] + list(KEYS["03.2"]["answers"].items())
    out += [f"{q}{s}{a}" for q, a in pairs for s in ('": "', "': '", '\\": \\"')]
    return out


def test_the_release_holds_the_lessons_exercises_labkit_and_readme_only(built):
    """Top level: lessons, exercises, labkit, README, Makefile, pyproject; the zip holds the same
    files; no solutions, no keys, nothing of tests/, no instructor's notebook, no cache."""
    folder, files, zipped = built
    assert {p.split("/")[0] for p in files} == {"notebooks", "exercises", "labkit", "README.md", "Makefile", "pyproject.toml"}
    assert zipped == files
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(p.split("/", 1)[1] for p in files if p.startswith("notebooks/")) == lessons
    assert sorted(p for p in files if p.startswith("exercises/")) == sorted(
        f"exercises/{p.name}" for p in (ROOT / "solutions").glob("*.ipynb"))
    assert not any("keys" in p or "__pycache__" in p or "instructor" in p or p.startswith(("solutions", "tests"))
                   for p in files)
    readme = files["README.md"].decode()
    assert "make lab" in readme and "make test" in readme and "## For graders" not in readme


def test_no_solution_text_and_no_key_is_in_the_release(built):
    """Not one solution block's text, nor any text of the keys, in any file or zip member."""
    _, files, zipped = built
    texts = [t.decode(errors="replace") for t in [*files.values(), *zipped.values()]]
    blocks, secrets = _blocks(), _secrets()
    assert len(blocks) >= 17 and len(secrets) > 30
    for needle in blocks + secrets:
        assert not any(needle in t for t in texts), needle[:80]


def test_no_stored_output_shows_a_scorecard(built):
    """Task check cells carry no stored output, and no notebook shows a PASS line or points."""
    folder, files, _ = built
    for name in (p for p in files if p.endswith(".ipynb")):
        for cell in json.loads(files[name])["cells"]:
            shown = json.dumps(cell.get("outputs", []))
            assert "PASS " not in shown and "points)" not in shown, name
            if any(t.startswith("task:") for t in cell.get("metadata", {}).get("tags", [])):
                assert cell["outputs"] == [], name


def _run(folder: pathlib.Path, sources: list[str]):
    """Run ``sources`` as code cells in a kernel started in the release's exercises folder,
    importing the release's labkit."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    env = dict(os.environ, PYTHONPATH=str(folder))
    client = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(folder / "exercises")}})
    old = os.environ.copy()
    os.environ.update(env)  # the kernel (and the judge it starts) inherit this environment
    try:
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    return ["".join(o.get("text", "") + o.get("evalue", "") for o in c.outputs) for c in nb.cells]


def _check_cell(folder, exercise: str, task: str) -> str:
    nb = json.loads((folder / "exercises" / exercise).read_text())
    return next(cell_source(c) for c in nb["cells"] if f"task:{task}" in c["metadata"].get("tags", []))


def test_a_check_cell_judges_an_answer_from_inside_the_release(built):
    """In a kernel importing the release's labkit, 05.1's check cell (the release's) passes a
    right answer with full points and fails a constant; the quiz 09.1's says the grader scores it."""
    require_sandbox()
    folder = built[0]
    check = _check_cell(folder, "05-late-renewal.ipynb", "05.1")
    right = "def conservative_deadline(send_time, ttl, margin, max_drift):\n    return send_time + ttl * (1 - max_drift) - margin\n"
    wrong = "def conservative_deadline(send_time, ttl, margin, max_drift):\n    return send_time\n"
    quiz = _check_cell(folder, "09-review.ipynb", "09.1")
    out = _run(folder, [right, check, wrong, check, quiz, "import labkit.grading\nprint(labkit.grading.__file__)"])
    assert out[1].startswith("PASS 05.1: ") and "(10/10 points)" in out[1], out[1]
    assert "task 05.1: 0/10 points" in out[3], out[3]
    assert out[4].strip() == QUIZ_SAYS.format(task="09.1"), out[4]
    assert out[5].strip().startswith(str(folder / "labkit")), out[5]


def test_make_lab_serves_the_release(built, tmp_path):
    """``make lab`` inside the release (its .venv: this checkout's programs, already installed)
    serves the release's own folder until stopped: its exercises and lessons, and no solutions.
    The release's .venv is a folder of its own with a fresh stamp, so make installs nothing: a
    symlink to this checkout's .venv let it re-point the checkout's editable install at the
    release's temporary copy."""
    folder = built[0]
    (folder / ".venv").mkdir()
    (folder / ".venv" / "bin").symlink_to(ROOT / ".venv" / "bin")
    (folder / ".venv" / ".installed").touch()  # newer than the release's pyproject.toml
    def installed() -> dict:  # where this checkout's labkit is installed from
        found = (ROOT / ".venv").glob("lib/python*/site-packages/__editable__*labkit*")
        return {path.name: path.read_text() for path in found}

    before = installed()
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "TOKEN", "PORT")}
    env |= {"JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    lab = subprocess.Popen(["make", "-s", "lab"], cwd=folder, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        said = [lab.stdout.readline(), lab.stdout.readline()]
        port, token = re.search(r"http://127\.0\.0\.1:(\d+)/lab\?token=(\S+)", said[1]).groups()
        api = f"http://127.0.0.1:{port}/api/contents"
        wait_for(lambda: status_or_none(f"{api}?token={token}") == 200, "the release's JupyterLab", timeout=60)
        with urllib.request.urlopen(f"{api}?token={token}", timeout=5) as r:
            top = {item["name"] for item in json.load(r)["content"]}
        with urllib.request.urlopen(f"{api}/exercises?token={token}", timeout=5) as r:
            exercises = {item["name"] for item in json.load(r)["content"]}
        assert {"notebooks", "exercises", "labkit"} <= top and "solutions" not in top and "tests" not in top
        assert exercises == {p.name for p in (ROOT / "solutions").glob("*.ipynb")}
        assert status(api) == 403
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait()
    wait_for(lambda: status_or_none(api) is None, "the release's JupyterLab to stop", timeout=20)
    assert installed() == before, "make lab in the release reinstalled this checkout's labkit"
