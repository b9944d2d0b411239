"""Answers that reach into the judge through what it lends them: each must FAIL.

A second reader found these routes in the judge's first policy, and each passed a wrong answer
then: a lent context manager's generator frame led to the judge's builtins; a lent file store
handed out a path on the judge's disk; a statement that starts with a comment was skipped by the
trial's race tracer; the crash plan was readable in the trial's file; a TEMP table could shadow
what the trial reads back; a dropped trigger would disarm the crash; an endless recursive query would hang the judge.
Each tamper falls back to
a wrong answer when its route is closed, so it can pass only if the route is open.
"""

import pytest

import corpus_part1
from answers import judged, verdict_of

RACY = """
def fenced_insert(conn, job, invoice_id, amount, generation):
    \"\"\"Check the fence, then write in a transaction of its own: atomic, but racy.\"\"\"
    (fence,) = conn.execute(PREFIX + "SELECT generation FROM job_fence WHERE job_id = ?", (job,)).fetchone()
    if generation < fence:
        return False
    conn.execute(PREFIX + "BEGIN IMMEDIATE")
    try:
        conn.execute(PREFIX + "UPDATE job_fence SET generation = ? WHERE job_id = ?", (generation, job))
        conn.execute(PREFIX + UPSERT, {"job": job, "invoice": invoice_id, "amount": amount,
                                       "generation": generation})
    except BaseException:
        conn.execute(PREFIX + "ROLLBACK")
        raise
    conn.execute(PREFIX + "COMMIT")
    return True
"""
PROTECT = """
import labkit
def protect_payouts(db, job):
    labkit.Fence(db, job).protect("payouts", "counter")
"""
TRIGGER = """    try:
        db.execute("CREATE {temp}TRIGGER t_mine BEFORE INSERT ON {table} BEGIN SELECT 1; END")
    except Exception:
        pass
"""
PUBLISH = "def publish_report(generation, *, fence, files, outbox, mail, report, email):\n"
CASES = {
    "02.1": ("fenced_insert", {
        "statements that start with a comment, to blind the race tracer": 'PREFIX = "--\\n"\n' + RACY,
        "statements that start with a block comment": 'PREFIX = "/* x */ "\n' + RACY,
        "an endless recursive query (it would hang the judge, where the SQL runs)":
            'PREFIX = ""\n' + RACY.replace('    (fence,) = conn.execute(', '    conn.execute("WITH '
            'RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c")\n'
            '    (fence,) = conn.execute('),
        "drops the trial's triggers first": 'PREFIX = ""\n' + RACY.replace(
            '    (fence,) = conn.execute(', '    for (name,) in conn.execute("SELECT name FROM sqlite_master '
            'WHERE type = \'trigger\'").fetchall():\n        conn.execute(f"DROP TRIGGER {name}")\n'
            '    (fence,) = conn.execute('),
    }),
    "08.2": ("publish_report", {
        "walks a lent context manager's frame to the judge's builtins": PUBLISH + '''
    try:
        b = fence.guard(generation).gen.gi_frame.f_globals["__builtins__"]
        b["exec"]("import sys\\nfor m in list(sys.modules.values()):\\n"
                  "    if getattr(m, '__name__', '').startswith('labkit.grading.'):\\n"
                  "        m.expect = lambda *a, **k: None")
    except Exception:
        pass
''',
        "reads the judge's disk through a path the file store hands out": PUBLISH + '''
    try:
        files.path("x").parent.joinpath("/etc/hostname").read_text()
    except Exception:
        return
    with fence.guard(generation) as tx:
        files.write("report.txt", report, generation, tx=tx)
        outbox.add(tx, f"{fence.job}/report-email", "email", email)
''',
    }),
    "03.1": ("record_batch", {
        "reads the trial's crash plan and skips the batches it would crash": '''
def record_batch(conn, job, generation, invoices):
    try:
        if conn.execute("SELECT 1 FROM crash_plan").fetchall():
            return False
    except Exception:
        pass
    for invoice_id, amount in invoices.items():
        conn.execute("INSERT OR REPLACE INTO invoices(job_id, invoice_id, amount, generation) "
                     "VALUES (?, ?, ?, ?)", (job, invoice_id, amount, generation))
    return True
''',
    }),
    "03.3": ("protect_payouts", {  # 03.3's answer may create triggers, on its tables only
        "adds a trigger on a table 03.3 does not grant (leases)": PROTECT + TRIGGER.format(
            temp="", table="leases"),
        "adds a TEMP trigger on payouts": PROTECT + TRIGGER.format(temp="TEMP ", table="payouts"),
    }),
    "02.2": ("charge_once", {  # no other task's answer may create one
        "a right answer that also creates a trigger, which only 03.3 grants":
            corpus_part1.CORPUS["02.2"]["right"][next(iter(corpus_part1.CORPUS["02.2"]["right"]))]
            .replace("def charge_once(conn, ", "def charge_once(conn, *a, **k):\n"
                     + TRIGGER.format(temp="", table="invoices").strip("\n").replace("db.", "conn.")
                     + "\n    return _charge_once(conn, *a, **k)\ndef _charge_once(conn, ", 1),
    }),
    "06.1": ("release", {
        "shadows the trial's lease table with a TEMP copy": '''
def release(db, name, owner, generation):
    conn = db.conn
    try:
        conn.execute("CREATE TEMP TABLE leases AS SELECT * FROM main.leases")
        conn.execute("DELETE FROM temp.leases WHERE name = ?", (name,))
    except Exception:
        pass
    return conn.execute("DELETE FROM main.leases WHERE name = ?", (name,)).rowcount > 0
''',
    }),
}


@pytest.fixture(scope="module")
def verdicts():
    return {(task, label): got for task, (name, cases) in CASES.items()
            for label, got in map(lambda kv: (kv[0], verdict_of(kv[1])), judged(task, name, cases).items())}


@pytest.mark.parametrize("task,label", [(t, k) for t, (_, cases) in CASES.items() for k in cases])
def test_a_route_into_the_judge_is_closed(verdicts, task, label):
    passed, text = verdicts[task, label]
    assert not passed, f"{label!r} PASSED task {task}: {text}"
