"""A student's Run All of a lesson starts no process and no paced replay; the ▶ buttons do.

Each lesson runs top to bottom in a fresh kernel (nbclient), as JupyterLab's Run All runs it.
An IPython startup file in the kernel, installed before any lesson code, records every
process start (Python's audit events) and every paced run (``simpy.rt.RealtimeEnvironment``).
After Run All the record must be empty. Then every ▶ button is clicked in the kernel, and the
record must show what the button promises: a paced replay, or real worker processes.
"""

import json
import os
import pathlib
import sys

import nbformat
import pytest
from nbclient import NotebookClient

PROJECT = pathlib.Path(__file__).resolve().parents[1]
LESSONS = sorted((PROJECT / "notebooks").glob("*.ipynb"))

STARTUP = """
import sys, types
import matplotlib.font_manager  # builds the font cache (fc-list) before recording starts
import simpy.rt

record = types.ModuleType("labkit_run_all_record")
record.starts = []
sys.modules[record.__name__] = record
STARTS = {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
          "os.system", "os.exec", "pty.spawn"}

def _audit(event, args):
    if event in STARTS:
        record.starts.append(event)

sys.addaudithook(_audit)
_init = simpy.rt.RealtimeEnvironment.__init__

def _paced(self, *args, **kwargs):
    record.starts.append("paced replay")
    _init(self, *args, **kwargs)

simpy.rt.RealtimeEnvironment.__init__ = _paced
"""

READ = """
import json, labkit_run_all_record as record
print(json.dumps(record.starts))
"""

CLICK = """
import json, ipywidgets, labkit_run_all_record as record
from ipywidgets.widgets.widget import _instances
record.starts.clear()
clicked = []
for w in list(_instances.values()):
    if isinstance(w, ipywidgets.Button) and w.description.startswith("▶"):
        before = len(record.starts)
        w.click()
        clicked.append([w.description, sorted(set(record.starts[before:]))])
print(json.dumps(clicked))
"""


def last_line(cell) -> list:
    text = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")
    return json.loads(text.strip().splitlines()[-1])


def run_all(lesson: pathlib.Path, ipython_dir: pathlib.Path) -> tuple[list, list]:
    """Run ``lesson`` with the recorder, then click its ▶ buttons: (starts, clicks)."""
    nb = nbformat.read(lesson, as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(READ), nbformat.v4.new_code_cell(CLICK)]
    env = {**os.environ, "IPYTHONDIR": str(ipython_dir), "LABKIT_LIVE_SECONDS": "1"}
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(lesson.parent)}}
    )
    client.execute(env=env)
    return last_line(nb.cells[-2]), last_line(nb.cells[-1])


@pytest.fixture(scope="module")
def ipython_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ipython")
    startup = folder / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-record-starts.py").write_text(STARTUP)
    return folder


@pytest.mark.skipif(sys.platform != "linux", reason="the course's processes are Linux processes")
@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_run_all_starts_nothing_and_each_play_button_starts_its_demo(lesson, ipython_dir):
    starts, clicks = run_all(lesson, ipython_dir)
    assert starts == [], f"Run All of {lesson.name} started {starts}"
    assert clicks, f"{lesson.name} has no ▶ button for its instructor cells"
    for label, started in clicks:
        expected = "subprocess.Popen" if "live demo" in label else "paced replay"
        assert expected in started, f"clicking {label!r} started {started}, not a {expected}"
