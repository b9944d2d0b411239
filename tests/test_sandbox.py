"""What an answer can reach from inside the judge's sandbox (issue 12, "Tests").

Each probe is a function defined in a cell of a real :class:`judge.Sandbox` and called through
``box.answer``, as a trial calls an answer: what it returns is what the answer saw. Every
"cannot" has its "can" beside it (a file of the same kind that is visible, a write that fits,
the test's own connect), so that a probe that sees nothing at all cannot pass for a wall.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time

import pytest
from answers import judged, verdict_of
from prerequisites import require_sandbox

from labkit.grading import judge, sandbox

ROOT = pathlib.Path(__file__).resolve().parents[1]

PROBES = '''
import os, socket

def read(path):
    try:
        with open(path, "rb") as f:
            return ["read", f.read(200).decode("latin-1")]
    except OSError as exc:
        return ["refused", type(exc).__name__]

def imports(name):
    import importlib
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        return ["refused", type(exc).__name__]
    return ["imported", sorted(n for n in vars(module) if not n.startswith("__"))[:50]]

def write(path, megabytes, files=1):
    """Write ``files`` files of ``megabytes`` MB each; how many MB fit, and the error."""
    done = 0
    try:
        for i in range(files):
            with open(f"{path}.{i}", "wb") as f:
                for _ in range(megabytes):
                    f.write(b"x" * (1 << 20))
                    f.flush()
                    done += 1
    except OSError as exc:
        return [done, type(exc).__name__]
    finally:
        for i in range(files):
            try:
                os.remove(f"{path}.{i}")
            except OSError:
                pass
    return [done, None]

def status():  # capget(2): /proc shows the answer nothing
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    assert libc.capget(header, data) == 0
    tab, eff, prm = chr(9), data[3] << 32 | data[0], data[4] << 32 | data[1]
    return chr(10).join([f"CapEff:{tab}{eff:016x}", f"CapPrm:{tab}{prm:016x}"])

def undo(place):  # unmount what covers /tmp or /proc, or mount a tmpfs of its own
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    done = libc.umount2(place.encode(), 2) if place != "mount" else libc.mount(
        b"tmpfs", b"/tmp", b"tmpfs", 0, b"size=1m")
    return [done, os.strerror(ctypes.get_errno())]

def connect(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
    except OSError as exc:
        return type(exc).__name__
    return "connected"

def pid():
    return os.getpid()
'''


def _call(box: judge.Sandbox, name: str, *args):
    with box.answer(name, ()) as probe:
        return probe(*args)


@pytest.fixture(scope="module")
def places():
    """A folder beside the checkout (visible unless hidden) with another student's submission,
    a file that stays visible, and a file in the system temp dir."""
    parent = pathlib.Path(tempfile.mkdtemp(prefix=".labkit-sandbox-test-", dir=ROOT.parent))
    (parent / "other-student").mkdir()
    (parent / "other-student" / "02-fencing-tokens.ipynb").write_text('{"cells": []}\n')
    (parent / "visible.txt").write_text("visible\n")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as spare:
        spare.write("in the system temp dir\n")
    try:
        yield {"parent": parent, "submission": parent / "other-student", "temp": spare.name}
    finally:
        shutil.rmtree(parent, ignore_errors=True)
        os.remove(spare.name)


@pytest.fixture(scope="module")
def box(places):
    require_sandbox()
    with judge.Sandbox(hide=[places["submission"]], timeout=20) as box:
        assert box.cell(PROBES, 0) is None
        yield box


def test_an_answer_cannot_read_the_solutions_the_tests_git_or_another_submission(box, places):
    submission = places["submission"] / "02-fencing-tokens.ipynb"
    for path in (ROOT / "solutions" / "keys.json", ROOT / "solutions" / "02-fencing-tokens.ipynb",
                 ROOT / "tests" / "answers.py", ROOT / ".git" / "HEAD", submission,
                 places["temp"], ROOT / "labkit" / "grading" / "checks02.py",
                 ROOT / "labkit" / "grading" / "judge.py"):  # fmt: skip
        assert pathlib.Path(path).exists(), path  # here, in the judge's process
        assert _call(box, "read", str(path)) == ["refused", "FileNotFoundError"], path
    # nothing of the host is there unless named: not the file beside it, nor /etc/shadow
    for path in (places["parent"] / "visible.txt", "/etc/shadow", "/etc/hostname"):
        if pathlib.Path(path).exists():
            assert _call(box, "read", str(path)) == ["refused", "FileNotFoundError"], path
    fence = ROOT / "labkit" / "fence.py"  # what is named can be read: the probe can see
    assert _call(box, "read", str(fence)) == ["read", fence.read_text()[:200]]


def test_an_answer_imports_labkit_and_sqlite_utils_but_no_check(box):
    assert _call(box, "imports", "labkit")[0] == "imported"
    assert "Fence" in _call(box, "imports", "labkit")[1]
    assert _call(box, "imports", "sqlite_utils")[0] == "imported"
    assert _call(box, "imports", "labkit.mechanisms.timing")[0] == "imported"
    for name in ("labkit.grading.checks02", "labkit.grading.writers", "labkit.grading.judge"):
        assert _call(box, "imports", name) == ["refused", "ModuleNotFoundError"], name
    # labkit/grading/ is an empty folder there: at most an empty namespace package, no check
    grading = _call(box, "imports", "labkit.grading")
    assert grading[0] == "refused" or not {"TASKS", "check", "verdict", "keys"} & set(grading[1])


def test_an_answer_cannot_connect_to_a_socket_on_loopback(box):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        # refused, or (a network namespace of its own, its loopback down) unreachable
        assert _call(box, "connect", port) in ("ConnectionRefusedError", "OSError")
        socket.create_connection(("127.0.0.1", port), timeout=3).close()  # the judge's own: fine


def test_an_answer_writes_only_to_a_small_tmp(box):
    assert _call(box, "write", "/tmp/answer", 1) == [1, None]
    done, error = _call(box, "write", "/tmp/big", 10, 8)  # 80 MB in 10 MB files (file limit 16)
    assert error == "OSError" and done <= sandbox.TMP_BYTES >> 20  # a /tmp of its own, as small
    for place in ("/etc", "/usr", ROOT / "labkit", ROOT / ".venv"):
        refused = _call(box, "write", f"{place}/answer-was-here", 1)  # read-only, or not its own
        assert refused in ([0, "OSError"], [0, "PermissionError"]), (place, refused)
    assert not list((ROOT / "labkit").glob("answer-was-here*"))


# Each place hidden by a tmpfs (the checkout, /root, ..., /dev, /dev/shm) is sealed read-only once
# the binds are in: RLIMIT_AS does not count tmpfs pages, so a writable one would be bounded by
# the host's RAM only (it was, before: 80 MB fit in each).
def test_no_place_outside_tmp_is_writable(box):
    places = [ROOT / "labkit" / "grading", "/", "/root", "/home", "/var/tmp", "/dev", "/dev/shm"]
    if not str(ROOT).startswith("/tmp/"):  # a checkout under /tmp sits in the answer's /tmp
        places.append(ROOT)
    wrote = {str(p): _call(box, "write", f"{p}/answer-was-here", 10, 8) for p in places}
    assert all(done == 0 for done, _ in wrote.values()), wrote


def test_an_answer_has_no_capabilities(box):
    lines = dict(
        line.split(":\t", 1) for line in _call(box, "status").splitlines() if ":\t" in line
    )
    assert lines["CapEff"] == "0000000000000000"
    assert lines["CapPrm"] == "0000000000000000"


@pytest.mark.parametrize("place", ["/tmp", "/proc", "/dev/shm", "mount"])
def test_an_answer_cannot_undo_the_world_its_process_was_given(box, place):
    """Its own /tmp, and the empty /proc and /dev/shm, stay: no unmount, no mount of its own."""
    assert _call(box, "undo", place) == [-1, "Operation not permitted"]


def _workers() -> dict[int, bytes]:
    """This test's descendant processes that run the worker, pid -> cmdline."""
    parents, lines = {}, {}
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            lines[int(entry)] = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes()
    mine = {}
    for pid, line in lines.items():
        up = pid
        while up in parents and up != os.getpid():
            up = parents[up]
        if up == os.getpid() and b"worker.py" in line:
            mine[pid] = line
    return mine


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


def test_a_fork_loop_is_stopped_and_leaves_no_process_behind():
    require_sandbox()
    before = _workers()  # the other tests' sandbox, open for the module
    with judge.Sandbox(timeout=20) as box:
        assert box.cell(FORK_LOOP, 0) is None
        with box.answer("fork_loop", ()) as fork_loop:  # while the schedule lasts
            made = fork_loop()
            alive = {pid: line for pid, line in _workers().items() if pid not in before}
        assert 0 < made < 64
        assert len(alive) > made  # the loop's processes, still sleeping in the sandbox
    assert subprocess.run(["true"], check=False).returncode == 0  # the judge's machine still forks
    deadline = time.monotonic() + 10  # SIGKILL is delivered at once, reaped soon after
    while (left := set(alive) & set(_workers())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, {pid: alive[pid] for pid in left}


def test_an_answer_is_killed_at_its_cpu_limit(monkeypatch):
    require_sandbox()
    monkeypatch.setattr(sandbox, "LIMITS", dict(sandbox.LIMITS, cpu=2))
    with judge.Sandbox(timeout=30) as box:
        assert box.cell(PROBES + "\ndef spin():\n    while True:\n        pass\n", 0) is None
        with pytest.raises(judge.Refused, match="exited in the middle of a call"):
            _call(box, "spin")
        assert not box.broken  # only the schedule's copy died: the next one can run
        assert isinstance(_call(box, "pid"), int)


def test_a_task_whose_answer_spins_fails_with_the_reason(monkeypatch):
    require_sandbox()
    monkeypatch.setattr(sandbox, "LIMITS", dict(sandbox.LIMITS, cpu=2))
    spin = "def conservative_deadline(*args):\n    while True:\n        pass\n"
    passed, text = verdict_of(judged("05.1", "conservative_deadline", {"spin": spin}, timeout=30)["spin"])
    assert not passed and "exited in the middle of a call" in text, text


def test_a_task_that_answers_slowly_every_time_is_stopped_by_its_deadline():
    """Each call answers within the 1 s timeout, but a task may take 3 timeouts in all."""
    require_sandbox()
    slow = ("import time\ndef conservative_deadline(send_time, ttl, margin, max_drift):\n"
            "    time.sleep(0.5)\n    return send_time + ttl * (1 - max_drift) - margin\n")  # right
    passed, text = verdict_of(judged("05.1", "conservative_deadline", {"slow": slow}, timeout=1)["slow"])
    assert not passed and "the task took more than 3 s" in text, text


HOG = """
def hog(megabytes):
    block = bytearray(megabytes << 20)
    return len(block) >> 20
"""


def test_an_answer_is_stopped_at_its_memory_limit(monkeypatch):
    require_sandbox()
    with judge.Sandbox(timeout=30) as box:  # the default limit (2 GB): 768 MB fit
        assert box.cell(HOG, 0) is None
        assert _call(box, "hog", 768) == 768
    monkeypatch.setattr(sandbox, "LIMITS", dict(sandbox.LIMITS, memory=512 << 20))
    with judge.Sandbox(timeout=30) as box:
        assert box.cell(HOG, 0) is None
        with pytest.raises(MemoryError):
            _call(box, "hog", 768)
        assert _call(box, "hog", 16) == 16
    hog = "def conservative_deadline(*args):\n    return float(len(bytearray(768 << 20)))\n"
    passed, text = verdict_of(judged("05.1", "conservative_deadline", {"hog": hog})["hog"])
    assert not passed and "MemoryError" in text, text


def test_an_answer_that_loops_forever_times_out_and_breaks_its_box():
    require_sandbox()
    with judge.Sandbox(timeout=1) as box:
        assert box.cell("def forever(*args):\n    while True:\n        pass\n", 0) is None
        with pytest.raises(judge.Refused, match=r"stopped answering \(no answer within 1 s\)"):
            _call(box, "forever")
        assert box.broken
        with pytest.raises(judge.Refused):  # a broken box refuses, it does not hang
            _call(box, "forever")


#: a worker that stalls the judge's channel: where the answer's process talks to the judge (the
#: cells' pipe, fd 4; in a call, its schedule's socket, the one fd it kept), then how it stalls
_CHANNEL = {
    "cell": "fd = 4",
    "call": "import stat\nfd = next(f for f in range(3, 256) if _sock(f))",
}
_STALL = {
    "floods the judge with requests and reads none of the replies": """
msg = (json.dumps({"op": "req", "id": 1, "what": "len", "args": ["L", []]}) + "\\n").encode()
for _ in range(20000):
    os.write(fd, msg)
time.sleep(600)""",
    "sends a message a byte at a time, never ending it": """
while True:
    os.write(fd, b" ")
    time.sleep(0.1)""",
}
_SOCK = """
import json, os, stat, time
def _sock(f):
    try:
        return stat.S_ISSOCK(os.fstat(f).st_mode)
    except OSError:
        return False
"""


@contextlib.contextmanager
def _watchdog(seconds: int):
    """A hang fails the test (SIGALRM interrupts the judge's blocked read or write) instead of
    stopping the suite: a safety net, not a timed assertion."""

    def expired(*_):
        raise AssertionError(f"the judge was still waiting after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("where", sorted(_CHANNEL))
@pytest.mark.parametrize("stall", sorted(_STALL))
def test_a_worker_that_stalls_the_channel_breaks_its_box_within_the_timeout(where, stall):
    """Every send and receive of the judge's is bounded as a whole: a worker that stops reading
    (the judge's replies fill the pipe) or trickles bytes (each read is soon, no message ends)
    is refused at the per-message timeout, in a cell and in a call, and the box is broken. A
    cell's request on the cells' pipe is refused as soon as it is read: it is not a cell's reply."""
    require_sandbox()
    body = _CHANNEL[where] + _STALL[stall]
    with _watchdog(60), judge.Sandbox(timeout=2) as box:
        if where == "cell":
            with pytest.raises(judge.Refused, match=r"stopped (reading|answering) \(no |out of turn"):
                box.cell(_SOCK + body, 0)
        else:
            source = _SOCK + "def stall(*args):\n" + "\n".join("    " + l for l in body.splitlines())
            assert box.cell(source, 0) is None
            with pytest.raises(judge.Refused, match=r"stopped (reading|answering) \(no "):
                _call(box, "stall")
        assert box.broken


def test_without_bubblewrap_answers_still_run_out_of_process(monkeypatch, capfd):
    monkeypatch.setenv("LABKIT_NO_SANDBOX", "1")
    assert not judge.sandboxed()
    said = io.StringIO()
    with judge.Sandbox(timeout=20, warn=said) as box:
        assert box.cell(PROBES, 0) is None
        theirs = _call(box, "pid")
        folder = box.jail.folder
        assert os.path.isdir(folder)
    assert theirs != os.getpid()
    assert "UNSANDBOXED" in said.getvalue()
    assert not os.path.exists(folder)  # its private folder is removed with it


# BUG (labkit/grading/judge.py Sandbox, sandbox.py Jail): ``warn=sys.stderr`` is bound when the
# module is imported, so a later sys.stderr (pytest's capture, contextlib.redirect_stderr) never gets it.
def test_without_bubblewrap_the_warning_goes_to_the_current_stderr(monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_NO_SANDBOX", "1")
    with judge.Sandbox(timeout=20):
        pass
    assert "UNSANDBOXED" in capsys.readouterr().err


def test_the_judge_answers_and_records_each_request_of_the_answer():
    """An RNG draw and an SQL statement are requests the judge serves and records."""
    require_sandbox()
    source = "def draw(rng, conn):\n    conn.execute('SELECT ?', (7,))\n    return rng.uniform(0, 2)\n"
    with judge.Sandbox(timeout=5) as box:
        assert box.cell(source, 0) is None
        with box.answer("draw", ()) as draw:
            got = draw(random.Random(3), sqlite3.connect(":memory:"))
        assert got == random.Random(3).uniform(0, 2)
        assert box.served == [("Connection", "execute", ["SELECT ?", (7,)]),
                              ("Random", "method", ["uniform", [0, 2], {}])]


def test_a_fresh_rng_reaches_the_answer_as_its_own_copy_and_cannot_be_drawn_twice():
    """06.2's ``rng=Fresh(seed)`` crosses as a seed: the answer draws from a ``random.Random`` of
    its own, the same numbers as ``Random(seed)``, and no draw is a request to the judge. The
    judge's object is spent: drawing from it, or handing it over again, is refused."""
    require_sandbox()
    from labkit.errors import LabkitError
    from labkit.grading.lab import Fresh

    assert [Fresh(5).uniform(0, 9) for _ in range(2)] == [random.Random(5).uniform(0, 9)] * 2
    source = "def draw(rng):\n    return type(rng).__module__, [rng.uniform(0, 2) for _ in range(3)]\n"
    with judge.Sandbox(timeout=5) as box:
        assert box.cell(source, 0) is None
        with box.answer("draw", ()) as draw:
            rng = Fresh(3)
            got = draw(rng)
            with pytest.raises(LabkitError, match="handed to the answer"):
                rng.random()
            with pytest.raises(LabkitError, match="crosses once"):
                draw(rng)
            drawn = Fresh(4)
            drawn.random()
            with pytest.raises(LabkitError, match="crosses once"):
                draw(drawn)
        mine = random.Random(3)
        assert got == ("random", [mine.uniform(0, 2) for _ in range(3)])
        assert box.served == []


def test_a_lent_connection_reads_its_state_as_the_judge_has_it_with_fewer_round_trips():
    """``in_transaction`` comes with every message of the judge's (a worker runs only between
    one and its next request), and ``isolation_level`` with the lending: after judge code ran
    on the connection (a helper that commits), the answer still reads what the connection says,
    and neither read is a request of its own."""
    require_sandbox()
    from labkit.grading import lab

    source = """
def probe(conn, helper):
    conn.execute("BEGIN")
    seen = [conn.in_transaction]
    helper()
    seen.append(conn.in_transaction)
    conn.execute("BEGIN")
    seen.append(conn.in_transaction)
    conn.execute("COMMIT")
    return seen + [conn.in_transaction, conn.isolation_level]
"""
    with judge.Sandbox(timeout=5) as box, lab.scratch() as trial:
        db = trial.open()

        def helper() -> None:  # judge code, on the same connection
            db.conn.execute("COMMIT")

        helper.__module__ = "labkit.tests"  # lendable, as labkit's own callbacks are
        assert box.cell(source, 0) is None
        with box.answer("probe", ()) as probe:
            seen = probe(db.conn, helper)
        reads = [args[0] for kind, what, args in box.served if what == "getattr"]
    assert seen == [True, False, True, False, None]
    assert reads == []


#: a cell's ways to leave a mark in every worker of every schedule before (or outside) the
#: worker's world is its own; each probe reads how many marks it finds
_MARKS = {
    "a file in /tmp": "def _mark():\n    pass\n",
    "a file in the working folder (the root's /tmp)": "def _mark():\n    pass\nos.chdir('/tmp')\n",
    "an at-fork hook writes to /tmp": "def _mark():\n    _write()\nos.register_at_fork(after_in_child=_mark)\n",
    "an audit hook writes to /tmp at the first event": (
        "_first = [True]\ndef _mark(event, args):\n    if _first[0]:\n        _first[0] = False\n"
        "        _write()\nsys.addaudithook(_mark)\n"),
    "a gc callback writes to /tmp": (
        "_first = [True]\ndef _mark(phase, info):\n    if _first[0]:\n        _first[0] = False\n"
        "        _write()\ngc.callbacks.append(_mark)\n"),
}
_PROBE = """
import gc, os, sys
def _write():
    try:
        with open("/tmp/.marks", "a") as f:
            f.write("x")
    except OSError:
        pass
{mark}
def probe():
    for place in ("/tmp/.marks", ".marks"):
        with open(place, "a") as f:  # the probe's own mark: a count of the schedules, if shared
            f.write("x")
    return [len(open(place).read()) for place in ("/tmp/.marks", ".marks")]
"""


@pytest.mark.parametrize("how", sorted(_MARKS))
def test_no_cell_can_leave_a_mark_that_counts_the_schedules(how):
    """Whatever a cell registers (an at-fork hook, an audit hook, a gc callback) or leaves (its
    working folder in the root's /tmp), every worker of every schedule finds the same marks:
    the hooks run only once the worker's world is its own, and its working folder is its own."""
    require_sandbox()
    with judge.Sandbox(timeout=5) as box:
        assert box.cell(_PROBE.replace("{mark}", _MARKS[how]), 0) is None
        counts = []
        for _ in range(4):
            with box.answer("probe", ()) as probe:
                counts.append(probe())
    assert counts == [counts[0]] * 4, counts
