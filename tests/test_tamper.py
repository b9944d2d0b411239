"""Answers that try to fool the judge, one per class of issue 12: each must FAIL.

Each case is an answer cell pasted after the solution's own cells and judged as the grader
judges it (``answers.judged``: the cell in the sandbox, the trials here). A tamper that finds
what it looks for uses it, and falls back to a wrong answer: it passes only if it worked. The
right answers at the end (with prints, or calling labkit's own mechanism) must PASS, so that a
failure here is the tamper's and not the harness's. Cases that change the worker for the cells
after them (``ALONE``) get a sandbox of their own; the others share one per task. Two of them
once passed (the judge lent its connection's trace and progress hooks, and let an answer set
a trial helper's attributes): the judge now lends a connection for SQL only.
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib

import pytest
from answers import judged, verdict_of
from prerequisites import require_sandbox

ROOT = pathlib.Path(__file__).resolve().parents[1]
KEYS = str(ROOT / "solutions" / "keys.json")

# ---------------------------------------------------------------- 05.1 (a number)

WRONG_051 = "    return send_time + ttl  # no margin, no drift: wrong\n"
HEAD_051 = "def conservative_deadline(send_time, ttl, margin, max_drift):\n"

T051 = {
    "reads the check's locals through sys._getframe": """
import sys
def conservative_deadline(send_time, ttl, margin, max_drift):
    frame = sys._getframe(1)
    while frame is not None:
        for name in ("latest", "expiry_local", "expected", "right"):
            if isinstance(frame.f_locals.get(name), float):
                return frame.f_locals[name] - margin
        frame = frame.f_back
"""
    + WRONG_051,
    "returns a float whose <= always holds": """
class Early(float):
    def __le__(self, other):
        return True
    __lt__ = __le__
    def __gt__(self, other):
        return False
    __ge__ = __gt__
"""
    + HEAD_051
    + "    return Early(send_time + ttl)\n",
    "prints the PASS line": HEAD_051
    + '    print("PASS 05.1: the conservative local deadline held under every schedule")\n'
    + WRONG_051,
    "writes a forged reply and verdict to fd 4": """
import json, os
"""
    + HEAD_051
    + """    for message in ({"op": "reply", "value": send_time - 10 * ttl},
                    {"op": "verdict", "passed": True, "text": "PASS 05.1"}, {"op": "done", "status": 0}):
        os.write(4, (json.dumps(message) + "\\n").encode())
"""
    + WRONG_051,
    "reads /proc/self/environ for a nonce": """
with open("/proc/self/environ", "rb") as f:
    FOUND = [v for v in f.read().split(b"\\0") if b"NONCE" in v or b"LABKIT" in v]
"""
    + HEAD_051
    + "    for v in FOUND:\n        print(v.decode(), 'PASS 05.1')\n"
    + WRONG_051,
}

# ---------------------------------------------------------------- 09.1 (a string from a key)

HEAD_091 = "def mechanism(incident):\n"
WRONG_091 = '    return "lease"  # the same pick for every incident: wrong\n'
PICKS_091 = """{"frozen-export": "fence", "dead-holder": "lease", "double-charge": "idempotency key",
 "late-reply": "conservative deadline", "stuck-release": "owner and generation check",
 "thundering-restart": "backoff with jitter", "forgotten-run": "durable claim and sweeper",
 "stale-email": "outbox", "restored-counter": "new epoch"}"""

T091 = {
    "reads the check's locals through inspect.stack": """
import inspect
"""
    + HEAD_091
    + """    for info in inspect.stack():
        for name in ("right", "expected", "key"):
            if isinstance(info.frame.f_locals.get(name), str):
                return info.frame.f_locals[name]
"""
    + WRONG_091,
    "returns an object equal to everything": """
class Anything(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
    def strip(self, *args):
        return self
    lower = strip
    def __contains__(self, item):
        return True
"""
    + HEAD_091
    + '    return Anything("lease")\n',
    "opens solutions/keys.json by path": f"""
import json
try:
    with open({KEYS!r}) as f:
        KEY = json.load(f)["09.1"]
except OSError:
    KEY = None
"""
    + HEAD_091
    + "    if KEY:\n        return KEY[incident]['mechanism']\n"
    + WRONG_091,
    "walks / for keys.json and the solution notebooks": """
import json, os
KEY, PICKS = None, None
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if top != "/" or d not in ("proc", "sys", "dev", "usr", "lib", "lib64")]
    for name in files:
        if name == "keys.json" or name.endswith("review.ipynb"):
            try:
                text = open(os.path.join(top, name)).read()
            except OSError:
                continue
            if '"09.1"' in text:
                KEY = json.loads(text)["09.1"]
            elif "picks = {" in text:
                PICKS = text
"""
    + HEAD_091
    + """    if KEY:
        return KEY[incident]["mechanism"]
    if PICKS:
        return PICKS.split(incident)[1].split('"')[2]
"""
    + WRONG_091,
    "searches gc.get_objects for the key and the worker": """
import gc
KEY = None
for obj in gc.get_objects():
    if isinstance(obj, dict) and "frozen-export" in obj and isinstance(obj["frozen-export"], dict):
        KEY = obj
    if hasattr(obj, "ns") and hasattr(obj, "channel") and hasattr(obj, "out"):
        obj.out = lambda value: "fence"  # every value the worker sends back: the first key's pick
"""
    + HEAD_091
    + '    if KEY:\n        return KEY[incident]["mechanism"]\n'
    + WRONG_091,
    "patches json.dumps to forge every message": """
import json
REAL = json.dumps
def dumps(obj, *args, **kwargs):
    if isinstance(obj, dict) and obj.get("op") in ("reply", "error"):
        obj = {"op": "reply", "value": "fence"}
    return REAL(obj, *args, **kwargs)
json.dumps = dumps
"""
    + HEAD_091
    + WRONG_091,
    "a right answer that prints and writes to stderr": """
import sys
PICKS = """
    + PICKS_091
    + "\n"
    + HEAD_091
    + """    print("debug: looking up", incident)
    print("a warning", file=sys.stderr)
    sys.stderr.flush()
    return PICKS[incident]
""",
}
RIGHT = {"a right answer that prints and writes to stderr"}

# ---------------------------------------------------------------- 03.2 (a dict)

T032 = {
    "returns a dict subclass equal to every key": """
class Agree(dict):
    def __eq__(self, other):
        return True
    def __getitem__(self, key):
        return "a"
def split_database_answers():
    return Agree(q1="a", q2="a", q3="a", q4="a")
""",
    "reads the key from solutions/keys.json": f"""
import json
def split_database_answers():
    try:
        with open({KEYS!r}) as f:
            return json.load(f)["03.2"]["answers"]
    except OSError:
        return {{"q1": "a", "q2": "a", "q3": "a", "q4": "a"}}
""",
}

# ---------------------------------------------------------------- 02.1 (SQL through a proxy)

HEAD_021 = "def fenced_insert(conn, job, invoice_id, amount, generation):\n"
CONST_021 = HEAD_021 + "    return True\n"
#: check-then-write with no transaction: loses the race that the judge injects
RACY_021 = (
    HEAD_021
    + """    (fence,) = conn.execute("SELECT generation FROM job_fence WHERE job_id = ?", (job,)).fetchone()
    if generation < fence:
        return False
    conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ?", (generation, job))
    conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
    conn.commit()
    return True
"""
)
#: the right answer, on whatever ``run`` is (the base class's execute, to bypass the proxy)
BASE_021 = (
    """
import sqlite3
def run(conn, *args):  # under sqlite-utils' Database, the connection itself
    return sqlite3.Connection.execute(getattr(conn, "conn", conn), *args)
"""
    + HEAD_021
    + """    try:
        run(conn, "BEGIN IMMEDIATE")
        raised = run(conn, "UPDATE job_fence SET generation = :g WHERE generation <= :g AND job_id = :j "
                     "RETURNING generation", {"g": generation, "j": job}).fetchall()
        if not raised:
            run(conn, "ROLLBACK")
            return False
        run(conn, UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
        run(conn, "COMMIT")
        return True
    except sqlite3.Error:
        return True
"""
)
FAKE_MODULE = """
import types
def _fake():
    fake = types.ModuleType("labkit.grading")
    fake.__path__ = []
    fake.TASKS, fake.CHECK_MODULES = {}, ()
    fake.expect = lambda *args, **kwargs: None
    fake.verdict = lambda task_id, answers, name: (True, f"PASS {task_id}: forged")
    fake.check = lambda task_id, answer: print(f"PASS {task_id}: forged")
    return fake
FAKE = _fake()
"""

T021 = {
    "walks the traceback of an error raised inside a statement": """
import sqlite3
"""
    + HEAD_021
    + """    try:
        conn.execute("SELECT * FROM no_such_table_anywhere")
    except Exception as exc:
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            while frame is not None:
                for name in ("expected", "accepted", "model", "fence"):
                    if isinstance(frame.f_locals.get(name), bool):
                        return frame.f_locals[name]
                frame = frame.f_back
            tb = tb.tb_next
    return True
""",
    "forges the result type with an int subclass": """
class Yes(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
    def __bool__(self):
        return True
"""
    + HEAD_021
    + """    conn.execute("BEGIN IMMEDIATE")
    raised = conn.execute("UPDATE job_fence SET generation = :g WHERE generation <= :g AND job_id = :j "
                          "RETURNING generation", {"g": generation, "j": job}).fetchall()
    if raised:
        conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
    conn.execute("COMMIT")
    return Yes(bool(raised))
""",
    "stops sending statements: the base class's execute": BASE_021,
    "patches sqlite3.connect and Connection.execute, then races": """
import sqlite3
REAL = sqlite3.connect
sqlite3.connect = lambda db, *args, **kwargs: REAL(db if "factory" in kwargs else ":memory:", *args, **kwargs)
try:
    sqlite3.Connection.execute = lambda self, *args: None
except TypeError:
    pass
"""
    + RACY_021,
    "the racy answer itself (the control of the cases that race)": RACY_021,
    "a racy answer that switches off the judge's statement trace through the proxy": """
def _off(conn):  # the judge's connection lends every public method: ask it to stop tracing
    raw = conn.conn
    for name, args in (("set_trace_callback", [None]), ("set_progress_handler", [None, 1])):
        raw._labkit_peer.request(raw._labkit_id, "getattr", name)(*args)
"""
    + HEAD_021
    + """    _off(conn)
    (fence,) = conn.execute("SELECT generation FROM job_fence WHERE job_id = ?", (job,)).fetchone()
    if generation < fence:
        return False
    conn.execute("BEGIN IMMEDIATE")  # atomic against the crash, racy against B
    try:
        conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ?", (generation, job))
        conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return True
""",
    "replaces labkit.grading through the package attribute": "import labkit\n"
    + FAKE_MODULE
    + "labkit.grading = FAKE\n"
    + CONST_021,
    "serves a fake labkit.grading from a meta_path finder": """
import importlib.abc, importlib.util, sys
"""
    + FAKE_MODULE
    + """
class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.startswith("labkit.grading"):
            return importlib.util.spec_from_loader(name, self)
    def create_module(self, spec):
        return FAKE
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, Finder())
for name in [n for n in sys.modules if n.startswith("labkit.grading")]:
    del sys.modules[name]
"""
    + CONST_021,
    "patches importlib internals to hand out a fake module": """
import importlib, importlib._bootstrap as boot
"""
    + FAKE_MODULE
    + """
REAL_LOAD, REAL_IMPORT = boot._find_and_load, importlib.import_module
boot._find_and_load = lambda name, *a: FAKE if name.startswith("labkit.grading") else REAL_LOAD(name, *a)
importlib.import_module = lambda name, *a: FAKE if name.startswith("labkit.grading") else REAL_IMPORT(name, *a)
importlib.reload = lambda module: FAKE
"""
    + CONST_021,
    "replaces builtins.compile so later code returns True": """
import builtins
REAL = builtins.compile
def compile(source, filename, mode, *args, **kwargs):
    if mode == "exec" and "return" in str(source):
        source = "def fenced_insert(*args, **kwargs):\\n    return True\\n"
    return REAL(source, filename, mode, *args, **kwargs)
builtins.compile = compile
"""
    + CONST_021,
    "sets sys.settrace to rewrite what the worker sends": """
import sys, threading
def tracer(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "send" and "message" in frame.f_locals:
        message = frame.f_locals["message"]
        if isinstance(message, dict) and message.get("op") in ("reply", "error"):
            frame.f_locals["message"] = {"op": "reply", "value": True}
    return tracer
sys.settrace(tracer)
threading.settrace(tracer)
"""
    + CONST_021,
    "hooks the classes of labkit.errors": """
import labkit.errors as errors
errors.LabkitError.__init_subclass__ = classmethod(lambda cls, **kwargs: None)
class Everything(type):
    def __instancecheck__(cls, obj):
        return True
    def __subclasscheck__(cls, sub):
        return True
for name in ("LabkitError", "StaleGeneration", "BadArgument"):
    setattr(errors, name, Everything(name, (Exception,), {}))
"""
    + CONST_021,
    "a right answer that prints": HEAD_021
    + """    print("fenced_insert", job, invoice_id, generation)
    conn.execute("BEGIN IMMEDIATE")
    try:
        raised = conn.execute("UPDATE job_fence SET generation = :g WHERE generation <= :g "
                              "AND job_id = :j RETURNING generation", {"g": generation, "j": job}).fetchall()
        print("raised:", raised)
        if not raised:
            conn.execute("ROLLBACK")
            return False
        conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
        conn.execute("COMMIT")
        return True
    except BaseException:
        if conn.conn.in_transaction:  # a full disk: SQLite has already rolled back
            conn.execute("ROLLBACK")
        raise
""",
    "a right answer on labkit.Fence(...).guard": """
import labkit
"""
    + HEAD_021
    + """    try:
        with labkit.Fence(conn, job).guard(generation) as tx:
            tx.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount,
                                "generation": generation})
    except labkit.errors.StaleGeneration:
        return False
    return True
""",
}
RIGHT |= {"a right answer that prints", "a right answer on labkit.Fence(...).guard"}

# ---------------------------------------------------------------- 06.2 (an rng crosses as a proxy)

HEAD_062 = "def backoff(attempt, *, base, cap, rng):\n"
T062 = {
    "walks the traceback of an error raised by the rng callback": HEAD_062
    + """    try:
        rng.uniform("not", "numbers")
    except Exception as exc:
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            while frame is not None:
                if isinstance(frame.f_locals.get("ceiling"), float):
                    return frame.f_locals["ceiling"] / 2
                frame = frame.f_back
            tb = tb.tb_next
    return min(cap, base * 2 ** attempt) / 2  # no jitter: wrong
""",
    "a right answer on labkit.mechanisms.timing.backoff": """
from labkit.mechanisms import timing
"""
    + HEAD_062
    + "    print('backoff', attempt)\n    return timing.backoff(attempt, base=base, cap=cap, rng=rng)\n",
}
RIGHT |= {"a right answer on labkit.mechanisms.timing.backoff"}

# ---------------------------------------------------------------- 06.3 (a trial's callback crosses)

BODY_063 = """
    version, duration = execute(db, "SELECT version, duration FROM version_leases WHERE name = ?", (name,))[0]
    ok = wait(duration)
    PRINT
    with transaction(db):
        won = execute(db, "UPDATE version_leases SET owner = ?, generation = generation + 1, "
                          "version = version + 1 WHERE name = ? AND version = ? RETURNING generation",
                      (me, name, version))
    return won[0][0] if won else None
"""
HEAD_063 = "from labkit.db import execute, transaction\ndef claim_quiet_lease(db, name, me, *, wait):\n"
T063 = {
    "reaches the judge's world through wait's closure, self or globals and hides A's heartbeats": (
        HEAD_063
        + """    world = None
    for reach in (lambda: wait.__closure__[0].cell_contents, lambda: wait.__self__,
                  lambda: wait.__globals__["_World"]):
        try:
            world = reach()
            world.signs.clear()
            break
        except Exception:
            world = None
"""
        + BODY_063.replace(
            "PRINT",
            "if not ok and world is not None:  # the judge forgets A's heartbeats; read, claim at once\n"
            "        world.signs.clear()\n"
            "        version, duration = execute(db, 'SELECT version, duration FROM version_leases "
            "WHERE name = ?', (name,))[0]",
        )
    ),
    "a right answer that prints": HEAD_063
    + BODY_063.replace("    ok = wait(duration)\n", "    while not wait(duration):\n"
                       "        version, duration = execute(db, 'SELECT version, duration FROM version_leases "
                       "WHERE name = ?', (name,))[0]\n").replace("PRINT", "print('waited', duration)"),
}
RIGHT |= {"a right answer that prints"}

# ---------------------------------------------------------------- 08.1 (a judge's object crosses)

NAIVE_081 = """
import json
from labkit.db import execute, rowcount
def relay(db, mail):
    PRE
    pending = execute(db, "SELECT key, payload FROM outbox WHERE kind = 'email' AND state = 'pending'")
    for key, payload in pending:
        email = json.loads(payload)
        delivery = mail.send(email["to"], email["subject"], email["body"])  # no key: not once
        rowcount(db, "UPDATE outbox SET state = 'sent', provider_id = ? WHERE key = ?", (delivery.id, key))
"""
T081 = {
    "the relay without an idempotency key itself (the control)": NAIVE_081.replace("PRE", "pass"),
    "a relay without a key that sets the judge's mail.fail and drops its progress handler": (
        NAIVE_081.replace(
            "PRE",
            """mail.fail = {}  # a public attribute of the judge's flaky network: no failures
    raw = db.conn
    raw._labkit_peer.request(raw._labkit_id, "getattr", "set_progress_handler")(None, 1)""",
        )
    ),
}

TASKS = {
    "05.1": ("conservative_deadline", T051),
    "09.1": ("mechanism", T091),
    "03.2": ("split_database_answers", T032),
    "02.1": ("fenced_insert", T021),
    "06.2": ("backoff", T062),
    "06.3": ("claim_quiet_lease", T063),
    "08.1": ("relay", T081),
}
#: cases that change the worker for every later cell: each gets a sandbox of its own
ALONE = {
    "writes a forged reply and verdict to fd 4",
    "searches gc.get_objects for the key and the worker",
    "patches json.dumps to forge every message",
    "patches sqlite3.connect and Connection.execute, then races",
    "replaces labkit.grading through the package attribute",
    "serves a fake labkit.grading from a meta_path finder",
    "patches importlib internals to hand out a fake module",
    "replaces builtins.compile so later code returns True",
    "sets sys.settrace to rewrite what the worker sends",
    "hooks the classes of labkit.errors",
}
CASES = [(task, label) for task, (_, cases) in TASKS.items() for label in cases]


@pytest.fixture(scope="module")
def verdicts() -> dict:
    """``{(task, label): (passed, text)}``: the right answers first, then the shared tampers,
    then each tamper that changes the worker in a sandbox of its own."""
    require_sandbox()  # without it, reading solutions/ by path works: the sandbox is the wall
    out = {}
    for task, (name, cases) in TASKS.items():
        shared = {k: v for k, v in sorted(cases.items(), key=lambda kv: kv[0] not in RIGHT)}
        shared = {k: v for k, v in shared.items() if k not in ALONE}
        groups = [shared] + [{k: v} for k, v in cases.items() if k in ALONE]
        for group in filter(None, groups):
            out |= {(task, k): verdict_of(v) for k, v in judged(task, name, group).items()}
    return out


def _cases(right: bool) -> list:
    return [c for c in CASES if (c[1] in RIGHT) is right]


@pytest.mark.parametrize("task, label", _cases(right=False))
def test_a_tamper_fails(verdicts, task, label):
    passed, text = verdicts[task, label]
    assert not passed, f"{label!r} PASSED task {task}: {text}"
    assert text.startswith(f"task {task}: ")


@pytest.mark.parametrize("task, label", _cases(right=True))
def test_a_right_answer_passes(verdicts, task, label):
    assert verdicts[task, label] == (True, verdicts[task, label][1])
    assert verdicts[task, label][1].startswith(f"PASS {task}: ")


@pytest.mark.parametrize(
    "label, words",
    [
        ("stops sending statements: the base class's execute", "nothing changed"),
        ("forges the result type with an int subclass", "only plain values cross"),
        ("returns a float whose <= always holds", "only plain values cross"),
        ("returns a dict subclass equal to every key", "only plain values cross"),
        ("the racy answer itself (the control of the cases that race)", "knobs {'story': 'race', 'at': "),
        ("patches sqlite3.connect and Connection.execute, then races", "knobs {'story': 'race', 'at': "),
    ],
)
def test_no_evidence_fails_with_a_clear_message(verdicts, label, words):
    task = next(t for t, lab in CASES if lab == label)
    passed, text = verdicts[task, label]
    assert not passed and words in text, text


# ---------------------------------------------------------------- the grader's copy of a notebook

REWRITE = '''
import json, os
SKIP = ("/proc", "/sys", "/dev", "/usr", %r)
RIGHT = """%s"""
REWROTE = []
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if not os.path.join(top, d).startswith(SKIP)]
    for name in files:
        if name.endswith(".ipynb"):
            path = os.path.join(top, name)
            try:
                nb = json.load(open(path))
                for cell in nb["cells"]:
                    if "def mechanism" in "".join(cell["source"]):
                        cell["source"] = RIGHT
                json.dump(nb, open(path, "w"))
                REWROTE.append(path)
            except (OSError, ValueError, KeyError, TypeError):
                pass
def mechanism(incident):
    return "lease"
'''


def test_rewriting_the_notebook_files_changes_nothing(tmp_path):
    """The answer cell rewrites every notebook it can find with a right answer (skipping the
    course's own folders, should the sandbox ever leak): the grader judged the file as read."""
    require_sandbox()
    nb = json.loads((ROOT / "solutions" / "09-review.ipynb").read_text())
    right = "PICKS = " + PICKS_091 + "\n" + HEAD_091 + "    return PICKS[incident]\n"
    cells = [c for c in nb["cells"] if "def mechanism" in "".join(c["source"])]
    assert len(cells) == 1
    student = tmp_path / "mallory"
    student.mkdir()
    path = student / "09-review.ipynb"
    for source, outcome in ((right, "pass"), (REWRITE % (str(ROOT), right), "fail")):
        cells[0]["source"] = source
        path.write_text(json.dumps(nb))
        before = hashlib.sha256(path.read_bytes()).hexdigest()
        from labkit.grading.grader import grade

        (sub,) = grade([str(tmp_path)], cell_timeout=20, progress=io.StringIO())
        assert sub.outcomes == {"09.1": outcome}, sub.notes
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_the_cases_are_new_code():
    """Not the issue's text nor tests/answers.py's TAMPER: every case is written here."""
    from answers import TAMPER

    ours = [src for _, cases in TASKS.values() for src in cases.values()]
    assert not set(TAMPER.values()) & set(ours)


SQL_OUT = (
    HEAD_021
    + """    for sql in ("ATTACH DATABASE '{path}.db' AS outside", "CREATE TABLE outside.t(x)",
                "DETACH DATABASE outside", "VACUUM INTO '{path}.copy'"):
        try:
            conn.execute(sql)
        except Exception:
            pass
    return True
"""
)


def test_an_answer_writes_no_file_on_the_judges_machine_through_sql(tmp_path):
    """The statements run on the judge's connection, outside the sandbox: ATTACH and VACUUM INTO
    of a path of the judge's machine must not make a file there."""
    require_sandbox()
    path = tmp_path / "from-the-answer"
    passed, _ = verdict_of(judged("02.1", "fenced_insert", {"sql": SQL_OUT.format(path=path)})["sql"])
    assert not passed
    assert sorted(p.name for p in tmp_path.iterdir()) == []
