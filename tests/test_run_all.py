"""A student's Run All of a lesson starts no process and no paced replay; the ▶ buttons do.

It also shows no stray output: no cell ends by printing an object's repr such as ``<Axes: ...>``.

Each lesson runs top to bottom in a fresh kernel (nbclient), as JupyterLab's Run All runs it.
An IPython startup file in the kernel, installed before any lesson code, records every
process start (Python's audit events) and every paced run (``simpy.rt.RealtimeEnvironment``).
After Run All the record must be empty (a check called in a lesson starts the judge, the
process that grades, recorded apart: lesson 00 shows two, the one its check used and the one
started ahead for a next check). Then every ▶ button is clicked in
the kernel, and the record must show what the button promises: a paced replay, or real worker
processes.
"""

import json
import os
import pathlib
import re
import sys

import nbformat
import pytest
from kernels import Client as NotebookClient

from labkit.engines import etcd_cluster, redis_pair
from labkit.engines.servers import sweep
from labkit.errors import LabkitError

import engines

PROJECT = pathlib.Path(__file__).resolve().parents[1]
LESSONS = sorted((PROJECT / "notebooks").glob("*.ipynb"))

STARTUP = """
def _install():  # a closure, so the lesson's own names cannot touch the recorder
    import sys, types
    import matplotlib.font_manager  # builds the font cache (fc-list) before recording
    import simpy.rt

    record = types.ModuleType("labkit_run_all_record")
    record.starts = []
    sys.modules[record.__name__] = record
    starts = {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
              "os.system", "os.exec", "pty.spawn"}

    record.judged = []  # a check's judge: the process that grades, not a demo

    def audit(event, args):
        if event == "subprocess.Popen" and "labkit.grading.judge" in list(args[1] or ()):
            record.judged.append(list(args[1])[-1])
        elif event in starts:
            record.starts.append(event)

    sys.addaudithook(audit)
    init = simpy.rt.RealtimeEnvironment.__init__

    def paced(self, *args, **kwargs):
        record.starts.append("paced replay")
        init(self, *args, **kwargs)

    simpy.rt.RealtimeEnvironment.__init__ = paced


_install()
del _install
"""

READ = """
import json, labkit_run_all_record as record
print(json.dumps(record.starts + [f"judge {how}" for how in record.judged]))
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


def missing_engine(label: str) -> str | None:
    """Why the button's Redis or etcd can't start here, or None (always None when
    ``LABKIT_REQUIRE_ENGINES=1``: then the button must start it)."""
    try:
        (etcd_cluster if "etcd" in label else redis_pair).require()
    except LabkitError as missing:
        return None if os.environ.get("LABKIT_REQUIRE_ENGINES") == "1" else str(missing)
    return None


def last_line(cell) -> list:
    text = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")
    return json.loads(text.strip().splitlines()[-1])


STRAY = re.compile(r"^\(?<[\w.]+[ >:]|^\(.*, None\)$|^None$")  # an object's repr, a tuple of them


def stray_outputs(cells) -> list[str]:
    """Outputs that are only an object's repr, like ``<Axes: ...>`` or ``(<Axes: ...>, None)``."""
    found = []
    for cell in cells:
        for out in cell.get("outputs", []):
            text = out.get("data", {}).get("text/plain", "")
            if set(out.get("data", {})) == {"text/plain"} and STRAY.search(text.strip()):
                found.append(f"{cell.source.splitlines()[-1]!r} showed {text[:80]!r}")
    return found


def run_all(lesson: pathlib.Path, ipython_dir: pathlib.Path) -> tuple[list, list, list]:
    """Run ``lesson`` with the recorder, then click its ▶ buttons: (starts, clicks, strays)."""
    nb = nbformat.read(lesson, as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(READ), nbformat.v4.new_code_cell(CLICK)]
    env = {**os.environ, "IPYTHONDIR": str(ipython_dir), "LABKIT_LIVE_SECONDS": "1"}
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(lesson.parent)}}
    )
    client.execute(env=env)
    return last_line(nb.cells[-2]), last_line(nb.cells[-1]), stray_outputs(nb.cells[:-2])


@pytest.fixture(scope="module")
def ipython_dir(tmp_path_factory):
    """The kernels' IPython folder with the recorder; afterwards, their demos' folders are swept."""
    folder = tmp_path_factory.mktemp("ipython")
    startup = folder / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-record-starts.py").write_text(STARTUP)
    yield folder
    for prefix in ("labkit-run-", "labkit-server-"):  # the kernels that made them are gone
        sweep(prefix)


@pytest.mark.skipif(sys.platform != "linux", reason="the course's processes are Linux processes")
@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_run_all_starts_nothing_and_each_play_button_starts_its_demo(lesson, ipython_dir):
    starts, clicks, strays = run_all(lesson, ipython_dir)
    # lesson 00 imports the grader for its failing check: a judge starts ahead for that check
    # (``--ready``), and once it is used, another for the next check
    judged = ["judge --ready"] * 2 if lesson.stem == "00-start-here" else []
    assert starts == judged, f"Run All of {lesson.name} started {starts}"
    assert strays == [], "stray outputs:\n" + "\n".join(strays)
    assert clicks, f"{lesson.name} has no ▶ button for its instructor cells"
    for label, started in clicks:
        expected = "subprocess.Popen" if "live demo" in label else "paced replay"
        if "real PostgreSQL" in label:  # a throwaway server; without one, it says what to install
            expected = None if engines.missing_prerequisite() else "subprocess.Popen"
        if "real Redis" in label or "real etcd" in label:  # without one, a simulated run
            expected = None if missing_engine(label) else "subprocess.Popen"
        shown = f"clicking {label!r} started {started}, not a {expected}"
        assert expected is None or expected in started, shown
