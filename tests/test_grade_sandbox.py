"""The grader fails closed (issue 26): without bubblewrap or a process limit it grades nothing.

``--unsandboxed`` grades anyway and every row of every output says so. The process limit is
shown to stop a fork loop with each mechanism the sandbox uses: the pids cgroup of this machine
(cgroup v1), and, with that controller hidden, a cgroup2 mount the test makes itself (its pids
controller if the kernel lets this mount have it, else the user of its own that RLIMIT_NPROC
binds); with neither, the grader refuses. Hiding is real: a private mount namespace where a
tmpfs covers ``/sys/fs/cgroup``, so nothing in labkit is told to pretend.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from labkit.grading import notebooks
from prerequisites import require, require_sandbox

ROOT = notebooks.ROOT


@pytest.fixture(scope="module")
def subs(tmp_path_factory):
    """A class of two: one unsolved exercise 03 (it fails, with lines of what did not score), and
    a notebook that is not JSON (a row with no tasks)."""
    root = tmp_path_factory.mktemp("class")
    (root / "ann").mkdir()
    shutil.copy(ROOT / "exercises" / "03-dangerous-variants.ipynb", root / "ann")
    (root / "bob").mkdir()
    (root / "bob" / "09-review.ipynb").write_text("{not json")
    return root


def _grade(subs, *args, env=None, cwd=None, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-m", "labkit.grade", str(subs), *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def test_without_bubblewrap_the_grader_refuses_and_grades_nothing(subs, tmp_path):
    """With a PATH that lacks bwrap: exit status 3, the install hint, no scorecard, no file."""
    env = dict(os.environ, PATH=str(tmp_path))  # an empty folder
    out = _grade(subs, "--csv", tmp_path / "c.csv", "--junit", tmp_path / "j.xml",
                 "--feedback", tmp_path / "pages", env=env)
    assert out.returncode == 3, out
    assert "bubblewrap (bwrap) is not on PATH" in out.stderr and "apt-get install bubblewrap" in out.stderr
    assert out.stdout == "" and "grading" not in out.stderr.replace("refusing to grade", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_unsandboxed_grades_and_marks_every_row_of_every_output(subs, tmp_path):
    """``--unsandboxed`` without bwrap grades, and every scorecard row, every line of what did
    not score, every CSV row, every JUnit case and every notebook on a feedback page says so."""
    env = dict(os.environ, PATH=str(tmp_path / "none"))
    out = _grade(subs, "--unsandboxed", "--csv", tmp_path / "c.csv", "--junit", tmp_path / "j.xml",
                 "--feedback", tmp_path / "pages", env=env)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines()[1:] if line.strip() and line != "what did not score:"]
    rows = [line for line in lines if not line.startswith("  ")]
    assert {r.split()[0] for r in rows} == {"ann", "bob"} and any(line.startswith("  ann 03.1") for line in lines)
    assert all("UNSANDBOXED" in line for line in lines), lines
    table = list(csv.DictReader((tmp_path / "c.csv").open()))
    assert {r["student"] for r in table} == {"ann", "bob"}
    assert {r["sandbox"] for r in table} == {"UNSANDBOXED"}, table
    cases = ET.parse(tmp_path / "j.xml").getroot().findall("testcase")
    assert len(cases) == len(table)
    assert all(c.find("properties/property[@name='sandbox']").get("value") == "UNSANDBOXED" for c in cases)
    pages = [p.read_text() for p in (tmp_path / "pages").glob("*.html")]
    heads = [h.split("</h2>")[0] for page in pages for h in page.split("<h2>")[1:]]
    assert len(pages) == 2 and len(heads) == 2 and all("graded UNSANDBOXED" in h for h in heads), heads


def test_with_a_working_sandbox_no_row_says_unsandboxed(subs, tmp_path):
    """The mark tells the truth: with bubblewrap, even under ``--unsandboxed``, no row carries it."""
    require_sandbox()
    out = _grade(subs, "--unsandboxed", "--csv", tmp_path / "c.csv")
    assert out.returncode == 0 and "UNSANDBOXED" not in out.stdout + (tmp_path / "c.csv").read_text()
    assert {r["sandbox"] for r in csv.DictReader((tmp_path / "c.csv").open())} == {"bubblewrap"}


PROBE = r'''
import json, os, sys, time
from labkit.engines.servers import descendants, proc_state
from labkit.grading import judge, sandbox

FORK_LOOP = """
import os, time

def fork_loop():
    made = 0
    for _ in range(500):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        made += 1
    return made
"""
with judge.Sandbox(timeout=30) as box:
    assert box.cell(FORK_LOOP, 0) is None
    with box.answer("fork_loop", ()) as fork_loop:
        made = fork_loop()
        running = descendants(os.getpid())  # the worker, its copies and the loop's sleepers
    limit, group = box.jail.limit, str(box.jail.group)
for _ in range(1000):  # SIGKILL is at once; the kernel reaps them soon after
    left = [pid for pid in running if proc_state(pid) not in ("gone", "Z")]
    if not left:
        break
    time.sleep(0.01)
print(json.dumps({"limit": limit, "group": group, "made": made, "running": len(running),
                  "left": left, "missing": sandbox.missing()}))
'''


V2 = "/sys/fs/cgroup/v2"


def _hidden(script: str) -> str:
    """A shell line that covers /sys/fs/cgroup with a tmpfs (in a private mount namespace),
    mounts a cgroup2 of the test's own at /sys/fs/cgroup/v2, delegates its pids controller to
    its children if the kernel lets it have one, prints its controllers, and runs ``script``."""
    return (f"mount -t tmpfs none /sys/fs/cgroup && mkdir {V2} && mount -t cgroup2 none {V2} && "
            f"if grep -qw pids {V2}/cgroup.controllers; then echo +pids > {V2}/cgroup.subtree_control; fi && "
            f"cat {V2}/cgroup.subtree_control >&2 && echo >&2 && {script}")


def _in_namespace(line: str, env=None):
    require("hiding the pids controller", None if os.getuid() == 0 and shutil.which("unshare")
            else "needs root and unshare(1)", "LABKIT_REQUIRE_SANDBOX")
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", line],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


def _probe(out) -> dict:
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _stopped(found: dict) -> None:
    assert 0 < found["made"] < 64, found  # 32 processes a worker, fewer than the 500 it tried
    assert found["running"] > found["made"], found  # the loop's processes were there, sleeping
    assert found["left"] == [] and found["missing"] == [], found


def test_a_fork_loop_is_stopped_by_the_pids_cgroup_v1():
    """On this machine's cgroup v1 the worker's pids cgroup stops the loop; none is left."""
    require_sandbox()
    if not (pathlib.Path("/sys/fs/cgroup/pids") / "cgroup.procs").is_file():
        require("the cgroup v1 test", "this machine has no cgroup v1 pids controller", "LABKIT_REQUIRE_SANDBOX")
    found = _probe(subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                                  timeout=300, cwd=ROOT))
    assert found["limit"] == "cgroup" and found["group"].startswith("/sys/fs/cgroup/pids/"), found
    _stopped(found)


def test_without_cgroup_v1_a_fork_loop_is_stopped_by_cgroup_v2_or_a_user_of_its_own(tmp_path):
    """With v1 hidden and a cgroup2 of the test's own mounted: if the kernel lets that mount have
    the pids controller, the worker's group is made there (pids.max); otherwise (this kernel binds
    pids to v1) the worker runs as a uid of its own, which RLIMIT_NPROC binds although the grader
    is root. Either way the loop is stopped, and nothing is left running."""
    require_sandbox()
    (tmp_path / "probe.py").write_text(PROBE)
    out = _in_namespace(_hidden(f"exec {sys.executable} {tmp_path / 'probe.py'}"))
    found, delegated = _probe(out), out.stderr.split("\n")[0].split()
    if "pids" in delegated:
        assert found["limit"] == "cgroup" and found["group"].startswith(V2 + "/labkit-judge-"), found
    else:
        assert found["limit"] == "uid", (found, delegated)
    _stopped(found)


def test_with_no_process_limit_to_be_had_the_grader_refuses(subs, tmp_path):
    """Root, no pids cgroup (v1 hidden; the test's cgroup2 without pids, on this kernel) and no
    setpriv on PATH: nothing would bind an answer's fork loop, so the grader refuses, as without
    bwrap: exit status 3, what is missing, no scorecard, no file."""
    require_sandbox()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "bwrap").symlink_to(shutil.which("bwrap"))
    grader = f"PATH={tmp_path / 'bin'} exec {sys.executable} -m labkit.grade {subs} --csv {tmp_path / 'c.csv'}"
    out = _in_namespace(_hidden(grader))
    if "pids" in out.stderr.split("\n")[0].split():
        pytest.skip("this kernel lets the test's cgroup2 have pids: a limit can be had")
    assert out.returncode == 3, out
    assert "no process limit" in out.stderr and out.stdout == "" and not (tmp_path / "c.csv").exists()
