"""Two workers are two processes, and a crash is a real kill (issue 22).

A schedule's workers (A, its rival B, a successor) each run in a process of their own, forked
from the notebook's state after its cells ran: they share the database and nothing else. A
worker that dies at a statement is killed (SIGKILL): its call never returns, and the successor
starts from the notebook's state, not from what the dead one remembered. The probes below are
an answer's functions in a real :class:`judge.Sandbox`; the judge's side is what a trial does.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import random

import pytest
from answers import against_bare, judged
from prerequisites import require_sandbox

import corpus_part2
from labkit.grading import judge, lab

PROBE = """
import gc, os, sys
calls, me = [], []  # what this process remembers: the calls it served, a name it drew

def who(conn, tag=""):
    me[:] = me or [os.urandom(8).hex()]   # drawn in this process (the cells drew none)
    calls.append(tag)
    conn.execute("SELECT 1").fetchall()   # B may come here, before the 2nd statement
    conn.execute("SELECT 2").fetchall()
    return [me[0], list(calls)]

def shared(conn):
    # what the cells left that could join two workers: a pipe, shared memory, the root's
    # frames and objects (the fork message, the workers' pids, the seed)
    import gc, sys
    out = {}
    try:
        os.write(PIPE[1], b"x")
        out["pipe"] = len(os.read(PIPE[0], 100))
    except OSError as exc:
        out["pipe"] = type(exc).__name__
    MEMORY[0] = (MEMORY[0] + 1) % 256    # a shared counter, if shared
    out["memory"] = MEMORY[0]
    import ctypes                         # a shared map made writable again, then counted on
    for name, (mapped, at) in MAPS.items():
        if ctypes.CDLL(None).mprotect(ctypes.c_void_p(at), 4096, 3) == 0:
            ctypes.c_ubyte.from_address(at).value += 1
        out[name] = mapped[0]
    frames, frame = [], sys._getframe()
    while frame:
        frames.append(frame.f_code.co_name)
        frame = frame.f_back
    out["frames"] = frames[1:]
    out["root"] = sorted({k for o in gc.get_objects() if isinstance(o, dict) and "op" in o
                          for k in o if k in ("worker", "seed", "op")})
    try:
        with open(f"/tmp/.labkit/mark-{os.urandom(4).hex()}", "w"):
            pass
    except OSError:
        pass
    marks = [n for n in os.listdir("/tmp/.labkit") if n.startswith("mark-")]
    out["marks"] = len(marks)             # its own, if it could write one: never an earlier one's
    return out

HOOKED = {"before": 0, "parent": 0, "audit": 0}  # what the cells hang on the root's forks, kills
os.register_at_fork(before=lambda: HOOKED.update(before=HOOKED["before"] + 1),
                    after_in_parent=lambda: HOOKED.update(parent=HOOKED["parent"] + 1))
sys.addaudithook(lambda event, args: event in ("os.fork", "os.kill", "ctypes.dlsym")
                 and HOOKED.update(audit=HOOKED["audit"] + 1))

def signs(conn):
    \"\"\"What a schedule could be counted or told apart by: the pid, the parent's, what the
    earlier schedules left in /tmp and /dev/shm, the processes /proc shows, the counts of the
    root's forks and kills that the cells' hooks kept, the gc's counts.\"\"\"
    seen = {"pid": os.getpid(), "ppid": os.getppid(), "tmp": sorted(os.listdir("/tmp"))}
    seen["hooked"], seen["gc"] = dict(HOOKED), [gc.get_count(), [s["collections"] for s in gc.get_stats()]]
    seen["proc"] = sorted(os.listdir("/proc")) if os.path.isdir("/proc") else None
    seen["shm"] = sorted(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else None
    with open(f"/tmp/mark-{os.urandom(4).hex()}", "w") as f:   # /tmp can be written
        f.write(str(calls))
    calls.append("signs")
    return [seen, list(calls)]

def crash(conn, effect, die=True):
    calls.append("crash")
    try:
        conn.execute("SELECT 'DIE'" if die else "SELECT 1").fetchall()
    except Exception:            # an answer that means to outlive its own death
        pass
    effect()                     # a judge's object (an RNG draw), reached after the crash
    return list(calls)           # what this process remembers
"""


LEFT_OPEN = """
import mmap, os
PIPE, MEMORY = os.pipe(), mmap.mmap(-1, 4096)   # left open and mapped by a cell
MAPS = {}  # files opened for writing, mapped shared but read-only or not to be touched at all
for name, prot in (("read-only", mmap.PROT_READ), ("no access", 0)):
    fd = os.open(f"/tmp/{name}", os.O_RDWR | os.O_CREAT)
    os.ftruncate(fd, 4096)
    MAPS[name] = [mmap.mmap(fd, 4096, prot=prot)]
    with open("/proc/self/maps") as maps:
        MAPS[name].append(next(int(line.split("-")[0], 16) for line in maps if name in line))
"""


@pytest.fixture
def box():
    require_sandbox()
    with judge.Sandbox(timeout=10) as box:
        assert box.cell(LEFT_OPEN, 0) is None
        assert box.cell(PROBE, 1) is None
        yield box


def test_each_worker_is_a_process_of_its_own_and_keeps_its_own_memory(box):
    """The same connection goes back to the same process, with what it remembers; another
    connection is another worker: another process, which saw none of the first one's calls."""
    with lab.scratch() as tmp, box.answer("who", ()) as who:
        a, b = tmp.open().conn, tmp.open().conn
        first, rival, again = who(a, "A1"), who(b, "B1"), who(a, "A2")
    assert first[0] == again[0] != rival[0]
    assert again[1] == ["A1", "A2"] and rival[1] == ["B1"]


def test_a_rival_that_comes_in_the_middle_of_a_call_runs_in_another_process(box):
    """B, called by the trial just before A's 2nd statement (as every race here is), does not
    run nested inside A's process: it cannot tell that A is in the middle of a call."""
    with lab.scratch() as tmp, box.answer("who", ()) as who:
        a, b = tmp.open(), tmp.open()
        tracer = lab.Tracer(a)
        tracer.before(2, lambda: who(b.conn, "B"))
        outer = who(a.conn, "A")
    inner = tracer.result
    assert inner is not None, "the rival never came"
    assert inner[0] != outer[0]
    assert inner[1] == ["B"] and outer[1] == ["A"]  # neither saw the other's call


def test_no_schedule_and_no_worker_can_be_told_apart_from_inside(box):
    """Every worker of every schedule is pid 1 of its own numbering, with a /tmp of its own
    (what the cells left there, and nothing an earlier schedule wrote), an empty /proc and
    /dev/shm; no at-fork hook or audit hook of the cells' counts the root's forks and kills, and
    the gc's counts start from the same place: what one process sees, the next sees the same."""
    seen = []
    for _ in range(3):  # three schedules, two workers each
        with lab.scratch() as tmp, box.answer("signs", ()) as signs:
            seen += [signs(tmp.open().conn), signs(tmp.open().conn)]
    assert all(s == seen[0] for s in seen), seen
    marks = [name for s in seen for name in s[0]["tmp"] if name.startswith("mark-")]
    assert seen[0][1] == ["signs"] and not marks and ".labkit" in seen[0][0]["tmp"]


def test_nothing_the_cells_left_joins_two_workers(box):
    """A pipe the cells opened, memory they mapped shared (read-only or with no access too:
    mprotect undoes that where the file was opened for writing), the root's frames and messages:
    none reaches a worker, so A, B and a successor see the same, schedule after schedule."""
    seen = []
    for _ in range(2):
        with lab.scratch() as tmp, box.answer("shared", ()) as shared:
            seen += [shared(tmp.open().conn), shared(tmp.open().conn)]
    assert all(s == seen[0] for s in seen), seen
    assert seen[0]["pipe"] == "OSError" and seen[0]["memory"] == 1  # closed; its own copy
    assert seen[0]["read-only"] == seen[0]["no access"] == 1  # its own copies, made writable
    assert "worker" not in seen[0]["root"] and "seed" not in seen[0]["root"]
    assert "main" not in seen[0]["frames"] and seen[0]["marks"] <= 1


def test_a_crash_kills_the_process_and_the_successor_remembers_nothing(box):
    """A worker that dies at a statement gets no reply, no more requests served (the judge's
    object it calls after catching the error is never reached), and its call raises Killed in
    the trial. The successor, in the same schedule on a connection of its own, starts from the
    notebook's state: it remembers its own call only, not the dead one's."""
    effect = random.Random(1)
    with lab.scratch() as tmp, box.answer("crash", ()) as crash:
        dying = tmp.open()
        with lab.process(dying, lambda sql: "DIE" in sql) as fate:
            with pytest.raises(judge.Killed):
                crash(dying.conn, effect.random)
        assert fate["dead"]
        assert effect.getstate() == random.Random(1).getstate()  # never drawn: it was dead
        successor = crash(tmp.open().conn, effect.random, False)
    assert successor == ["crash"]  # not ["crash", "crash"]: the dead one's memory is gone


def test_after_a_kill_the_schedule_goes_on_with_fresh_processes(box):
    """The kill does not stall the schedule or break the sandbox: the dead worker's connection,
    called again, gets a fresh process (which dies at the same statement again), and another
    worker's call on the same schedule is served."""
    with lab.scratch() as tmp, box.answer("crash", ()) as crash:
        dying, other = tmp.open(), tmp.open()
        with lab.process(dying, lambda sql: "DIE" in sql):
            for _ in range(2):
                with pytest.raises(judge.Killed):
                    crash(dying.conn, random.Random(2).random)
        assert crash(other.conn, random.Random(2).random) == ["crash"]  # nobody dies here
    assert not box.broken


# ------------------------------------------------------------------ graded: memory across a crash

REMEMBER_UNITS = """
_issued_here = set()    # in this process's memory: the units it issued
_bare = {name}
def {name}(claims, claim, units, issue_invoice, **kw):
    def once(tx, unit, amount):
        if unit in _issued_here:   # "I issued it before I crashed": skip it
            return None
        _issued_here.add(unit)
        return issue_invoice(tx, unit, amount)
    return _bare(claims, claim, units, once, **kw)
"""
REMEMBER_SENDS = """
_tried_here = set()     # in this process's memory: the emails it tried to send
_bare = {name}
class _Remembered:
    id = "remembered"
class _Once:
    def __init__(self, mail):
        self.mail = mail
    def send(self, *args, **kw):
        mark = repr((args, sorted((k, v) for k, v in kw.items() if k != "idempotency_key")))
        if mark in _tried_here:     # "I sent it before I crashed": do not send it again
            return _Remembered()
        _tried_here.add(mark)
        return self.mail.send(*args, **kw)
    def __getattr__(self, name):
        return getattr(self.mail, name)
def {name}(db, mail):
    return _bare(db, _Once(mail))
"""
OUTLIVE = """
_bare = {name}
def {name}(*args, **kwargs):
    for attempt in range(3):      # whatever stops me, including my death, try again
        try:
            return _bare(*args, **kwargs)
        except BaseException:
            pass
"""
CRASHING = {"07.2": REMEMBER_UNITS, "08.1": REMEMBER_SENDS}  # the tasks whose workers crash
WRAPPERS = {"remembers across its crash": None, "outlives its own death": OUTLIVE}


def _sources(task: str) -> tuple:
    entry, out = corpus_part2.CORPUS[task], {}
    for label, (bare, *_) in entry["wrong"].items():
        out[f"{label}/bare"] = bare
        for how, wrapper in WRAPPERS.items():
            out[f"{label}/{how}"] = bare + (wrapper or CRASHING[task]).replace("{name}", entry["name"])
    return task, entry["name"], out


@pytest.fixture(scope="module")
def crashed():
    """Every wrong answer of the crashing tasks, bare and wrapped, judged in one run's seed."""
    require_sandbox()
    jobs = [_sources(task) for task in CRASHING]
    fork = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=fork) as pool:
        return dict(zip(CRASHING, pool.map(judged, *zip(*jobs))))


@pytest.mark.parametrize("task", sorted(CRASHING))
@pytest.mark.parametrize("how", sorted(WRAPPERS))
def test_what_a_crashed_worker_remembered_gains_a_wrong_answer_nothing(crashed, task, how):
    """A successor is a fresh process: an answer that remembers what it did before its crash
    (and skips it), or that catches its own death and carries on, scores no more than bare.
    (With the successor in the dead worker's process, remembering gained 07.2's "checkpoint
    after every unit, in its own transaction first" 1.4 points: 5.7 bare, 7.1 wrapped.)"""
    reports = crashed[task]
    for label in corpus_part2.CORPUS[task]["wrong"]:
        bare, wrapped = reports[f"{label}/bare"], reports[f"{label}/{how}"]
        against_bare("detect a nested or concurrent call, or a crash, and behave differently", how, task, bare, wrapped)
        assert bare.problem is None, bare.text()
        assert wrapped.total()[0] <= bare.total()[0], f"{label}, {how}:\n{wrapped.text()}"


DRAWS = """
import random

def draws(conn=None, die=False, then=None):
    first = random.random()
    inner = then() if then is not None else None      # the rival, called while A's call runs
    if conn is not None:
        conn.execute("SELECT 'DIE'" if die else "SELECT 1").fetchall()
    return [first, inner, random.random()]           # A's own stream goes on after the rival
"""


def play_draws(answer, tmp, killed) -> list:
    """The script of calls both ways: workers a and b, a rival b inside a's call, a call with no
    connection, a's death at a statement and its successor on the same connection."""
    a, b = tmp.open(), tmp.open()

    def rival(conn=None):  # a trial's callback (the judge lends those of labkit's modules)
        def call():
            return answer(conn) if conn is not None else answer()

        call.__module__ = "labkit.grading.trial"
        return call

    seen = [answer(a.conn), answer(b.conn), answer(a.conn, then=rival(b.conn))]
    seen += [answer(), answer(a.conn, then=rival())]  # no connection: by depth
    with lab.process(a, lambda sql: "DIE" in sql), pytest.raises(killed):
        answer(a.conn, die=True)
    return seen + [answer(a.conn), answer(b.conn)]


def test_a_replay_draws_the_random_numbers_of_the_sandboxs_processes(box):
    """What each call drew from ``random`` in the sandbox (A, B, a rival nested in A's call, the
    no-connection calls by depth, a successor after a kill: a process each, seeded by its
    number) is what the replay's in-process answer draws (OwnLuck), call for call."""
    from answers import define
    from labkit.grading.forks import OwnLuck

    assert box.cell(DRAWS, 2) is None
    lab.LUCK.append(20261204)
    try:
        with lab.scratch() as tmp, box.answer("draws", ()) as remote:
            sandboxed = play_draws(remote, tmp, judge.Killed)
        with lab.scratch() as tmp:
            replayed = play_draws(OwnLuck(define(DRAWS, "draws"), lab.LUCK[-1]), tmp, Exception)
    finally:
        lab.LUCK.pop()
    assert sandboxed == replayed and len({str(s) for s in sandboxed}) == len(sandboxed), sandboxed
