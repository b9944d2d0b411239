"""Answers to the tasks of lessons 01-04, as a student would type them into an answer cell.

``CORPUS[task]`` has the function's ``name`` and two dicts of source strings:
``right`` (correct answers in styles different from the solution's: they must
pass) and ``wrong`` (known-wrong answers, each a mistake a lesson names, plus a
constant, each with ``(source, phrase)``: they must fail, and ``phrase`` is a
piece of the property the failure must name). The answer-cell prefixes that
tamper with the grader are in tests/answers.py (``TAMPER``).
"""

_UPSERT = '''
UPSERT = """INSERT INTO invoices(job_id, invoice_id, amount, generation)
            VALUES (:job, :invoice, :amount, :generation)
            ON CONFLICT(job_id, invoice_id) DO UPDATE SET
                amount = excluded.amount, generation = excluded.generation"""
RAISE = """UPDATE job_fence SET generation = :generation
           WHERE generation <= :generation AND job_id = :job RETURNING generation"""
'''

# --------------------------------------------------------------------- 02.1 fenced insert
_SKELETON = """
def fenced_insert(conn, job, invoice_id, amount, generation):
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not conn.execute("{raise_}", {{"job": job, "generation": generation}}).fetchall():
            conn.execute("ROLLBACK")
            return False
        conn.execute(UPSERT, {{"job": job, "invoice": invoice_id, "amount": amount, "generation": generation}})
        conn.execute("COMMIT")
        return True
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
"""
FENCED_RIGHT = {
    "labkit's Fence.guard": _UPSERT + '''
import labkit
def fenced_insert(conn, job, invoice_id, amount, generation):
    try:
        with labkit.Fence(conn, job).guard(generation) as tx:
            tx.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
    except labkit.StaleGeneration:
        return False
    return True
''',
    "labkit.db.transaction and the row count of a plain conditional UPDATE": _UPSERT + '''
from labkit.db import transaction, rowcount, execute
class Refused(Exception):
    pass
def fenced_insert(conn, job, invoice_id, amount, generation):
    params = {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation}
    try:
        with transaction(conn):
            if rowcount(conn, "UPDATE job_fence SET generation = :generation "
                              "WHERE generation <= :generation AND job_id = :job", params) != 1:
                raise Refused()          # leaving the block by an exception rolls back
            execute(conn, UPSERT, params)
    except Refused:
        return False
    return True
''',
}

FENCED_WRONG = {
    "sqlite-utils upsert: under a full disk its probe fails and its fallback drops the row": (_UPSERT + '''
def fenced_insert(conn, job, invoice_id, amount, generation):
    conn.execute("BEGIN IMMEDIATE")
    committed = False
    try:
        if conn.execute(RAISE, {"job": job, "generation": generation}).fetchall():
            conn["invoices"].upsert({"job_id": job, "invoice_id": invoice_id, "amount": amount,
                                     "generation": generation}, pk=("job_id", "invoice_id"))
            conn.execute("COMMIT")
            committed = True
    finally:
        if not committed and conn.conn.in_transaction:
            conn.execute("ROLLBACK")
    return committed
''', "a crash inside the transaction leaves nothing behind",
        ("newer", "equal", "all or nothing", "propagates")),
    "on an error, keeps the fence raised (commits the raise alone), then re-raises": (_UPSERT + '''
def fenced_insert(conn, job, invoice_id, amount, generation):
    params = {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation}
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not conn.execute(RAISE, params).fetchall():
            conn.execute("ROLLBACK")
            return False
        conn.execute(UPSERT, params)
        conn.execute("COMMIT")
        return True
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.execute(RAISE, params).fetchall()     # "we got the fence: keep it"
        raise
''', "leaves nothing behind", "all or nothing"),
    'reads the invoice before raising the fence': (_UPSERT + '\ndef fenced_insert(conn, job, invoice_id, amount, generation):\n    conn.execute("BEGIN IMMEDIATE")\n    try:\n        conn.execute("SELECT amount FROM invoices WHERE job_id = ? AND invoice_id = ?", [job, invoice_id]).fetchall()\n        if not conn.execute(RAISE, {"job": job, "generation": generation}).fetchall():\n            conn.execute("ROLLBACK")\n            return False\n        conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})\n        conn.execute("COMMIT")\n        return True\n    except BaseException:\n        if conn.conn.in_transaction:\n            conn.execute("ROLLBACK")\n        raise\n', 'the fence is raised before', 'fence first'),
    "check-then-act: read, compare in Python, write unconditionally": (_UPSERT + '''
def fenced_insert(conn, job, invoice_id, amount, generation):
    (current,) = conn.execute("SELECT generation FROM job_fence WHERE job_id = ?", [job]).fetchone()
    if generation < current:
        return False
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ?", [generation, job])
    conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
    conn.execute("COMMIT")
    return True
''', "writes nothing when the fence is at", "stale"),
    "missing rollback when no row comes back": (_UPSERT + '''
def fenced_insert(conn, job, invoice_id, amount, generation):
    conn.execute("BEGIN IMMEDIATE")
    if not conn.execute(RAISE, {"job": job, "generation": generation}).fetchall():
        return False
    conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
    conn.execute("COMMIT")
    return True
''', "ends its transaction", "ends"),
    "writes the invoice first, raises the fence after": (_UPSERT + '''
def fenced_insert(conn, job, invoice_id, amount, generation):
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
        if not conn.execute(RAISE, {"job": job, "generation": generation}).fetchall():
            conn.execute("ROLLBACK")
            return False
        conn.execute("COMMIT")
        return True
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
''', "the fence is raised before", ("fence first", "stale")),
    "no transaction: two autocommit statements": (_UPSERT + '''
def fenced_insert(conn, job, invoice_id, amount, generation):
    if not conn.execute(RAISE, {"job": job, "generation": generation}).fetchall():
        return False
    conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
    return True
''', "writes nothing when the fence is at", ("stale", "all or nothing")),
    "the fence's WHERE forgets the job": (_UPSERT + _SKELETON.format(
        raise_="UPDATE job_fence SET generation = :generation WHERE generation <= :generation RETURNING 1"),
        "changes nothing else", ("newer", "equal", "stale")),
    "equal generations refused (< instead of <=)": (_UPSERT + _SKELETON.format(
        raise_="UPDATE job_fence SET generation = :generation WHERE generation < :generation AND job_id = :job "
               "RETURNING 1"), "equal generations pass", "equal"),
    "the fence passes only the generation it holds (= instead of <=)": (_UPSERT + _SKELETON.format(
        raise_="UPDATE job_fence SET generation = :generation WHERE generation = :generation AND job_id = :job "
               "RETURNING 1"), "raises the fence of its own job", "newer"),
    "no ROLLBACK when the fence refuses (only the error path has one)": (_UPSERT + """
def fenced_insert(conn, job, invoice_id, amount, generation):
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not conn.execute(RAISE, {"job": job, "generation": generation}).fetchall():
            return False
        conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
        conn.execute("COMMIT")
        return True
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
""", "ends its transaction", "ends"),
    "errors swallowed: ROLLBACK, then return False": (_UPSERT + """
def fenced_insert(conn, job, invoice_id, amount, generation):
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not conn.execute(RAISE, {"job": job, "generation": generation}).fetchall():
            conn.execute("ROLLBACK")
            return False
        conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
        conn.execute("COMMIT")
        return True
    except Exception:
        conn.execute("ROLLBACK")
        return False
""", "propagates to the caller", "propagates"),
    "deferred BEGIN: reads, compares, then writes": (_UPSERT + """
def fenced_insert(conn, job, invoice_id, amount, generation):
    conn.execute("BEGIN")
    try:
        (current,) = conn.execute("SELECT generation FROM job_fence WHERE job_id = ?", [job]).fetchone()
        if generation < current:
            conn.execute("ROLLBACK")
            return False
        conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ?", [generation, job])
        conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
        conn.execute("COMMIT")
        return True
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
""", "is refused", "stale"),
    "a constant: always True": ('''
def fenced_insert(conn, job, invoice_id, amount, generation):
    return True
''', "an accepted write stores its invoices", None),
}

# --------------------------------------------------------------------- 02.2 charge once
_CHARGE = '''
CHARGE = "INSERT INTO charges(job_id, invoice_id, amount, generation) VALUES (?, ?, ?, ?) RETURNING id"
'''
ONCE_RIGHT = {
    "run_once inside Fence.guard": _CHARGE + '''
import labkit
def charge_once(conn, job, key, invoice_id, amount, generation):
    try:
        with labkit.Fence(conn, job).guard(generation) as tx:
            return labkit.run_once(tx, key, lambda tx: tx.execute(CHARGE, [job, invoice_id, amount, generation])[0][0])
    except labkit.StaleGeneration:
        return None
''',
    "the key's row count decides, result read back on a repeat": _CHARGE + '''
from labkit.db import transaction, execute, rowcount
class Refused(Exception):
    pass
def charge_once(conn, job, key, invoice_id, amount, generation):
    try:
        with transaction(conn):
            if rowcount(conn, "UPDATE job_fence SET generation = ? WHERE job_id = ? AND generation <= ?",
                        [generation, job, generation]) == 0:
                raise Refused()
            if rowcount(conn, "INSERT OR IGNORE INTO idempotency_keys(key) VALUES (?)", [key]) == 1:
                charge_id = execute(conn, CHARGE, [job, invoice_id, amount, generation])[0][0]
                execute(conn, "UPDATE idempotency_keys SET result = ? WHERE key = ?", [str(charge_id), key])
                return charge_id
            return int(execute(conn, "SELECT result FROM idempotency_keys WHERE key = ?", [key])[0][0])
    except Refused:
        return None
''',
}

_ONCE = """
def charge_once(conn, job, key, invoice_id, amount, generation):
    conn.execute('BEGIN IMMEDIATE')
    try:
        if not conn.execute('UPDATE job_fence SET generation = ? WHERE job_id = ? AND generation <= ? '
                            'RETURNING generation', [generation, job, generation]).fetchall():
            {refused}
        new = conn.execute('INSERT INTO idempotency_keys(key) VALUES (?) ON CONFLICT(key) DO NOTHING', [key]).rowcount
        if not new:
            (stored,), = conn.execute('SELECT result FROM idempotency_keys WHERE key = ?', [key]).fetchall()
            conn.execute('COMMIT')
            return int(stored)
        (charge_id,), = conn.execute(CHARGE, [job, invoice_id, amount, generation]).fetchall()
        conn.execute('UPDATE idempotency_keys SET result = ? WHERE key = ?', [charge_id, key])
        conn.execute('COMMIT')
        return charge_id
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute('ROLLBACK')
        raise
"""
ONCE_WRONG = {
    'raises the fence in a transaction of its own, then the key and the charge': (_CHARGE + _ONCE.format(refused="conn.execute('ROLLBACK')\n            return None").replace(
        "        new = conn.execute(", "        conn.execute('COMMIT')\n        conn.execute('BEGIN IMMEDIATE')\n        new = conn.execute("), 'a crash leaves no charge', 'rolls back'),
    'answers 0 when the fence refuses': (_CHARGE + _ONCE.format(refused="conn.execute('ROLLBACK')\n            return 0"), 'returns None, charges nothing', 'stale'),
    "the fence alone (no operation key)": (_CHARGE + '''
import labkit
def charge_once(conn, job, key, invoice_id, amount, generation):
    try:
        with labkit.Fence(conn, job).guard(generation) as tx:
            return tx.execute(CHARGE, [job, invoice_id, amount, generation])[0][0]
    except labkit.StaleGeneration:
        return None
''', "charges nothing", "repeat"),
    "the key recorded in its own transaction before the charge": (_CHARGE + '''
import labkit
def charge_once(conn, job, key, invoice_id, amount, generation):
    fresh = conn.execute("INSERT INTO idempotency_keys(key) VALUES (?) ON CONFLICT DO NOTHING", [key]).rowcount
    try:
        with labkit.Fence(conn, job).guard(generation) as tx:
            if not fresh:
                stored = tx.execute("SELECT result FROM idempotency_keys WHERE key = ?", [key])[0][0]
                return None if stored is None else int(stored)
            charge_id = tx.execute(CHARGE, [job, invoice_id, amount, generation])[0][0]
            tx.execute("UPDATE idempotency_keys SET result = ? WHERE key = ?", [charge_id, key])
            return charge_id
    except labkit.StaleGeneration:
        return None
''', "charges exactly once", ("first", "rolls back", "stale")),
    "the key looked up before the transaction (check-then-act on the key)": (_CHARGE + '''
import labkit
def charge_once(conn, job, key, invoice_id, amount, generation):
    seen = conn.execute("SELECT result FROM idempotency_keys WHERE key = ?", [key]).fetchall()
    try:
        with labkit.Fence(conn, job).guard(generation) as tx:
            if seen:
                return int(seen[0][0])
            charge_id = tx.execute(CHARGE, [job, invoice_id, amount, generation])[0][0]
            tx.execute("INSERT OR REPLACE INTO idempotency_keys(key, result) VALUES (?, ?)", [key, charge_id])
            return charge_id
    except labkit.StaleGeneration:
        return None
''', "charges nothing", "repeat"),
    "the key checked before the fence (a stale repeat gets the old id)": (_CHARGE + '''
import labkit
def charge_once(conn, job, key, invoice_id, amount, generation):
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT result FROM idempotency_keys WHERE key = ?", [key]).fetchall()
        if row:
            conn.execute("COMMIT")
            return int(row[0][0])
        if not conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ? AND generation <= ? RETURNING 1",
                            [generation, job, generation]).fetchall():
            conn.execute("ROLLBACK")
            return None
        charge_id = conn.execute(CHARGE, [job, invoice_id, amount, generation]).fetchall()[0][0]
        conn.execute("INSERT INTO idempotency_keys(key, result) VALUES (?, ?)", [key, charge_id])
        conn.execute("COMMIT")
        return charge_id
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
''', "fence", ("stale", "repeat")),
    "INSERT OR IGNORE of the key, but the charge regardless of its row count": (_CHARGE + '''
import labkit
def charge_once(conn, job, key, invoice_id, amount, generation):
    try:
        with labkit.Fence(conn, job).guard(generation) as tx:
            tx.execute("INSERT OR IGNORE INTO idempotency_keys(key) VALUES (?)", [key])
            return tx.execute(CHARGE, [job, invoice_id, amount, generation])[0][0]
    except labkit.StaleGeneration:
        return None
''', "charges nothing", "repeat"),
    "a constant: always None": ('''
def charge_once(conn, job, key, invoice_id, amount, generation):
    return None
''', "charges exactly once", None),
    "the fence's row count ignored (a stale call charges)": (_CHARGE + _ONCE.format(
        refused="pass  # the UPDATE matched no row, but the charge goes on"), "is refused: it returns None", ("stale", "first")),
    "a new charge's id never returned (only a repeat gets it)": (_CHARGE + _ONCE.format(
        refused="conn.execute('ROLLBACK')\n            return None").replace(
        "        conn.execute('COMMIT')\n        return charge_id", "        conn.execute('COMMIT')"),
        "returns the id of the charge it made", "first"),
    "no ROLLBACK when the fence refuses (only the error path has one)": (_CHARGE + _ONCE.format(
        refused="return None"), "ends its transaction", "ends"),
    "COMMIT in finally (the fence's raise outlives a crash)": (_CHARGE + _ONCE.format(
        refused="conn.execute('ROLLBACK')\n            return None").replace(
        "    except BaseException:\n        if conn.conn.in_transaction:\n            conn.execute('ROLLBACK')\n        raise",
        "    finally:\n        if conn.conn.in_transaction:\n            conn.execute('COMMIT')"),
        "a crash leaves no charge", ("rolls back", "first")),
    "errors swallowed: ROLLBACK, then return None": (_CHARGE + _ONCE.format(
        refused="conn.execute('ROLLBACK')\n            return None").replace(
        "    except BaseException:\n        if conn.conn.in_transaction:\n            conn.execute('ROLLBACK')\n        raise",
        "    except Exception:\n        conn.execute('ROLLBACK')\n        return None"),
        "propagates", "propagates"),
}

# --------------------------------------------------------------------- 03.1 batch writer
BATCH_RIGHT = {
    "Fence.guard around the whole batch": _UPSERT + '''
import labkit
def record_batch(conn, job, generation, invoices):
    try:
        with labkit.Fence(conn, job).guard(generation) as tx:
            for invoice_id, amount in invoices.items():
                tx.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
    except labkit.StaleGeneration:
        return False
    return True
''',
    "executemany inside an explicit transaction, row count of the UPDATE": _UPSERT + '''
def record_batch(conn, job, generation, invoices):
    raw = conn.conn
    raw.execute("BEGIN IMMEDIATE")
    try:
        won = raw.execute("UPDATE job_fence SET generation = ? WHERE job_id = ? AND generation <= ?",
                          (generation, job, generation)).rowcount
        if won == 1:
            raw.executemany(UPSERT, [{"job": job, "invoice": i, "amount": a, "generation": generation}
                                     for i, a in invoices.items()])
            raw.execute("COMMIT")
            return True
        raw.execute("ROLLBACK")
        return False
    except Exception:
        if raw.in_transaction:
            raw.execute("ROLLBACK")
        raise
''',
}

_BATCH = """
def record_batch(conn, job, generation, invoices):
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ? AND {cond}",
                        [generation, job, generation]).rowcount != 1:
            conn.execute("ROLLBACK")
            return False
        for invoice_id, amount in invoices.items():
            conn.execute(UPSERT, {{"job": job, "invoice": invoice_id, "amount": amount, "generation": generation}})
        conn.execute("COMMIT")
        return True
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
"""
BATCH_WRONG = {
    "reads the batch's invoices before raising the fence": (_UPSERT + '\ndef record_batch(conn, job, generation, invoices):\n    conn.execute("BEGIN IMMEDIATE")\n    try:\n        for invoice_id in invoices:\n            conn.execute("SELECT amount FROM invoices WHERE job_id = ? AND invoice_id = ?", [job, invoice_id]).fetchall()\n        if not conn.execute(RAISE, {"job": job, "generation": generation}).fetchall():\n            conn.execute("ROLLBACK")\n            return False\n        for invoice_id, amount in invoices.items():\n            conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})\n        conn.execute("COMMIT")\n        return True\n    except BaseException:\n        if conn.conn.in_transaction:\n            conn.execute("ROLLBACK")\n        raise\n', 'the fence is raised before', 'fence first'),
    "the given check-then-act worker, unchanged": (_UPSERT + '''
def record_batch(conn, job, generation, invoices):
    (current,) = conn.execute("SELECT generation FROM job_fence WHERE job_id = ?", [job]).fetchone()
    if generation < current:
        return False
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ?", [generation, job])
    for invoice_id, amount in invoices.items():
        conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
    conn.execute("COMMIT")
    return True
''', "writes nothing when the fence is at", "stale"),
    "on an error, keeps the fence raised (commits the raise alone), then re-raises": (_UPSERT + '''
def record_batch(conn, job, generation, invoices):
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not conn.execute(RAISE, {"job": job, "generation": generation}).fetchall():
            conn.execute("ROLLBACK")
            return False
        for invoice_id, amount in invoices.items():
            conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
        conn.execute("COMMIT")
        return True
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.execute(RAISE, {"job": job, "generation": generation}).fetchall()  # "we got the fence: keep it"
        raise
''', "leaves nothing behind", "all or nothing"),
    "one fenced transaction per invoice (not all or nothing)": (_UPSERT + '''
import labkit
def record_batch(conn, job, generation, invoices):
    try:
        for invoice_id, amount in invoices.items():
            with labkit.Fence(conn, job).guard(generation) as tx:
                tx.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
    except labkit.StaleGeneration:
        return False
    return True
''', "the batch is all or nothing", "all or nothing"),  # B between two of its
    # transactions (a boundary only the enumeration reaches) sees half of A's batch: A's half
    # is not judged again (it blamed "equal" or "newer" by the generation the run drew)
    "a conditional UPDATE whose row count is ignored": (_UPSERT + '''
def record_batch(conn, job, generation, invoices):
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ? AND generation <= ?",
                 [generation, job, generation])
    for invoice_id, amount in invoices.items():
        conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
    conn.execute("COMMIT")
    return True
''', "is refused", "stale"),
    "the check moved inside the transaction but the row count still ignored, and no rollback": (_UPSERT + '''
def record_batch(conn, job, generation, invoices):
    conn.execute("BEGIN IMMEDIATE")
    (current,) = conn.execute("SELECT generation FROM job_fence WHERE job_id = ?", [job]).fetchone()
    if generation < current:
        return False
    conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ?", [generation, job])
    for invoice_id, amount in invoices.items():
        conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
    conn.execute("COMMIT")
    return True
''', "ends its transaction", "ends"),
    "a constant: always False": ('''
def record_batch(conn, job, generation, invoices):
    return False
''', "is accepted", None),
    "equal generations refused (< instead of <=)": (_UPSERT + _BATCH.format(cond="generation < ?"),
                                                    "equal generations pass", "equal"),
    "the fence passes only the generation it holds (= instead of <=)": (
        _UPSERT + _BATCH.format(cond="generation = ?"), "raises the fence of its own job", "newer"),
    "writes the batch first, then the conditional UPDATE": (_UPSERT + """
def record_batch(conn, job, generation, invoices):
    conn.execute("BEGIN IMMEDIATE")
    try:
        for invoice_id, amount in invoices.items():
            conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
        if conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ? AND generation <= ?",
                        [generation, job, generation]).rowcount != 1:
            conn.execute("ROLLBACK")
            return False
        conn.execute("COMMIT")
        return True
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
""", "the fence is raised before", ("fence first", "stale")),
    "no ROLLBACK when the fence refuses (only the error path has one)": (_UPSERT + """
def record_batch(conn, job, generation, invoices):
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ? AND generation <= ?",
                        [generation, job, generation]).rowcount != 1:
            return False
        for invoice_id, amount in invoices.items():
            conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
        conn.execute("COMMIT")
        return True
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
""", "ends its transaction", "ends"),
    "errors swallowed: ROLLBACK, then return False": (_UPSERT + """
def record_batch(conn, job, generation, invoices):
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ? AND generation <= ?",
                        [generation, job, generation]).rowcount != 1:
            conn.execute("ROLLBACK")
            return False
        for invoice_id, amount in invoices.items():
            conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
        conn.execute("COMMIT")
        return True
    except Exception:
        conn.execute("ROLLBACK")
        return False
""", "propagates to the caller", "propagates"),
    "deferred BEGIN: reads the fence, compares, then writes": (_UPSERT + """
def record_batch(conn, job, generation, invoices):
    conn.execute("BEGIN")
    try:
        (current,) = conn.execute("SELECT generation FROM job_fence WHERE job_id = ?", [job]).fetchone()
        if generation < current:
            conn.execute("ROLLBACK")
            return False
        conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ?", [generation, job])
        for invoice_id, amount in invoices.items():
            conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
        conn.execute("COMMIT")
        return True
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
""", "is refused", "stale"),
}

# --------------------------------------------------------------------- 03.2 quiz
QUIZ_RIGHT = {
    "capital letters": '''
def split_database_answers():
    return {"q1": "B", "q2": "B", "q3": "A", "q4": "C"}
''',
    "built from pairs, with spaces": '''
def split_database_answers():
    return dict([("q4", " c "), ("q3", "a"), ("q2", "b"), ("q1", "b")])
''',
}

QUIZ_WRONG = {
    "believes the invoices file refuses the stale write": ('''
def split_database_answers():
    return {"q1": "b", "q2": "a", "q3": "a", "q4": "c"}
''', "q2", "generations"),
    "believes a longer lease fixes it": ('''
def split_database_answers():
    return {"q1": "b", "q2": "b", "q3": "a", "q4": "a"}
''', "q4", "generations"),
    "believes A's step is one transaction": ('''
def split_database_answers():
    return {"q1": "a", "q2": "b", "q3": "c", "q4": "c"}
''', "q1", "transactions"),
    "believes one file is safe only because it is faster": ('''
def split_database_answers():
    return {"q1": "b", "q2": "b", "q3": "b", "q4": "c"}
''', "think again about what the one-file version", "transactions"),
    "a constant: all a": ('''
def split_database_answers():
    return {"q1": "a", "q2": "a", "q3": "a", "q4": "a"}
''', "answered right", None),
    "a constant: all b": ('''
def split_database_answers():
    return {"q1": "b", "q2": "b", "q3": "b", "q4": "b"}
''', "answered right", None),
    "a list instead of a dict": ('''
def split_database_answers():
    return ["b", "b", "a", "c"]
''', "a dict", None),
}

# --------------------------------------------------------------------- 01.1 lost updates
LOST_RIGHT = {
    "per invoice, the committed writes in order, then pairs": '''
from collections import defaultdict
def find_lost_updates(history):
    committed = defaultdict(list)
    for event in history:
        if event.action == "write" and event.outcome == "ok":
            committed[event.target].append(event)
    lost = [earlier for writes in committed.values()
            for earlier, later in zip(writes, writes[1:]) if later.generation < earlier.generation]
    return sorted(lost, key=history.index)
''',
    "from labkit.check's overwriting events back to the writes they replaced": '''
import labkit.sim.history
def find_lost_updates(history):
    lost = []
    for v in labkit.sim.history.check(history):
        if v.kind != "lost_update":
            continue
        i = history.index(v.event)
        before = [e for e in history[:i] if e.action == "write" and e.outcome == "ok" and e.target == v.event.target]
        if before and v.event.generation < before[-1].generation:
            lost.append(before[-1])
    return sorted(lost, key=history.index)
''',
}

LOST_WRONG = {
    "returns the overwriting writes instead of the lost ones": ('''
def find_lost_updates(history):
    last, found = {}, []
    for e in history:
        if e.action == "write" and e.outcome == "ok":
            if e.target in last and e.generation < last[e.target].generation:
                found.append(e)
            last[e.target] = e
    return found
''', "the lost writes are exactly", "victims"),
    "counts rejected writes as if they had committed": ('''
def find_lost_updates(history):
    last, found = {}, []
    for e in history:
        if e.action == "write":
            if e.target in last and e.generation < last[e.target].generation:
                found.append(last[e.target])
            last[e.target] = e
    return sorted(found, key=history.index)
''', "the lost writes are exactly", "committed"),
    "compares with the highest generation ever, not the stored one": ('''
def find_lost_updates(history):
    top, last, found = {}, {}, []
    for e in history:
        if e.action == "write" and e.outcome == "ok":
            if e.target in top and e.generation < top[e.target]:
                found.append(last[e.target])
            top[e.target] = max(top.get(e.target, 0), e.generation)
            last[e.target] = e
    return sorted(found, key=history.index)
''', "the lost writes are exactly", "newer or equal"),
    "an equal generation counted as a loss (<=)": ('''
def find_lost_updates(history):
    last, found = {}, []
    for e in history:
        if e.action == "write" and e.outcome == "ok":
            if e.target in last and e.generation <= last[e.target].generation:
                found.append(last[e.target])
            last[e.target] = e
    return sorted(found, key=history.index)
''', "the lost writes are exactly", "newer or equal"),
    "compares with the previous committed write, whatever its invoice": ('''
def find_lost_updates(history):
    writes = [e for e in history if e.action == "write" and e.outcome == "ok"]
    return [a for a, b in zip(writes, writes[1:]) if b.generation < a.generation]
''', "the lost writes are exactly", "per invoice"),
    "the victims grouped by invoice": ('''
from collections import defaultdict
def find_lost_updates(history):
    committed = defaultdict(list)
    for event in history:
        if event.action == "write" and event.outcome == "ok":
            committed[event.target].append(event)
    return [earlier for writes in committed.values()
            for earlier, later in zip(writes, writes[1:]) if later.generation < earlier.generation]
''', "in the order they appear in the history", "in order"),
    "the victims in the order they were overwritten": ('''
def find_lost_updates(history):
    last, lost = {}, []
    for e in history:
        if e.action == "write" and e.outcome == "ok":
            if e.target in last and e.generation < last[e.target].generation:
                lost.append(last[e.target])
            last[e.target] = e
    return lost
''', "in the order they appear in the history", "in order"),
    "a constant: nothing is ever lost": ('''
def find_lost_updates(history):
    return []
''', "the lost writes are exactly", None),
}

# --------------------------------------------------------------------- 01.2 predict overwrite
PREDICT_RIGHT = {
    "the boundary written as 'not at or before'": '''
def predict_overwrite(pause, ttl):
    b_writes_inv1_at = ttl + 1.5
    return not pause <= b_writes_inv1_at
''',
    "asks the engine (a run is the most honest prediction)": '''
from labkit.scenarios import expired_but_alive
def predict_overwrite(pause, ttl):
    run = expired_but_alive(protected=False, pause=pause, ttl=ttl)
    (inv1,) = [r for r in run.tables["invoices"] if r["invoice_id"] == "INV-1"]
    return inv1["generation"] == 7
''',
}

PREDICT_WRONG = {
    "overwrites as soon as the lease has expired": ('''
def predict_overwrite(pause, ttl):
    return pause > ttl
''', "the prediction matches the real run", "edges"),
    "the tie goes the wrong way (>=)": ('''
def predict_overwrite(pause, ttl):
    return pause >= ttl + 1.5
''', "the prediction matches the real run", "edges"),
    "forgets B's work and expects the overwrite at expiry or after": ('''
def predict_overwrite(pause, ttl):
    return pause >= ttl
''', "the prediction matches the real run", "edges"),
    "thinks a longer lease is safe": ('''
def predict_overwrite(pause, ttl):
    return ttl < 30 and pause > ttl + 1.5
''', "the prediction matches the real run", ("far", "edges")),
    "no overwrite once B's own lease has run out": ('''
def predict_overwrite(pause, ttl):
    return ttl + 1.5 < pause <= 2 * ttl
''', "the prediction matches the real run", "far"),
    "a constant: always True": ('''
def predict_overwrite(pause, ttl):
    return True
''', "the prediction matches the real run", None),
}

# --------------------------------------------------------------------- 04.1 epoch issuer
_ISSUE = '''
from labkit.db import transaction, execute
NEXT = "UPDATE epoch_counter SET counter = counter + 1 WHERE name = ? RETURNING epoch, counter"
'''
ISSUE_RIGHT = {
    "labkit's EpochIssuer": '''
from labkit.mechanisms.issuers import EpochIssuer
from labkit.fence import token
def issue(store, authority, name, recovered):
    issuer = EpochIssuer(store, name)
    if recovered:
        issuer.start_epoch(authority)
    return token(issuer.issue())
''',
    "one upsert that keeps the larger epoch": _ISSUE + '''
def issue(store, authority, name, recovered):
    with transaction(store):
        if recovered:
            epoch = authority.next_epoch(name)
            execute(store, "INSERT INTO epoch_counter(name, epoch, counter) VALUES (?, ?, 0) "
                           "ON CONFLICT(name) DO UPDATE SET epoch = excluded.epoch, counter = 0 "
                           "WHERE excluded.epoch > epoch_counter.epoch", (name, epoch))
        epoch, counter = execute(store, NEXT, (name,))[0]
    return epoch, counter
''',
}

ISSUE_WRONG = {
    "a plain counter that trusts the recovered store": (_ISSUE + '''
def issue(store, authority, name, recovered):
    with transaction(store):
        return tuple(execute(store, NEXT, (name,))[0])
''', "every token is above every token issued before it", "above"),
    "a new epoch counted by the store itself (epoch + 1)": (_ISSUE + '''
def issue(store, authority, name, recovered):
    with transaction(store):
        if recovered:
            execute(store, "UPDATE epoch_counter SET epoch = epoch + 1, counter = 0 WHERE name = ?", (name,))
        return tuple(execute(store, NEXT, (name,))[0])
''', "every token is above every token issued before it", "above"),
    "a million added to the counter after recovery": (_ISSUE + '''
def issue(store, authority, name, recovered):
    with transaction(store):
        if recovered:
            execute(store, "UPDATE epoch_counter SET counter = counter + 1000000 WHERE name = ?", (name,))
        return tuple(execute(store, NEXT, (name,))[0])
''', "every token is above every token issued before it", ("above", "steps")),
    "the new epoch written, the counter not restarted": (_ISSUE + '''
def issue(store, authority, name, recovered):
    with transaction(store):
        if recovered:
            execute(store, "UPDATE epoch_counter SET epoch = ? WHERE name = ?", (authority.next_epoch(name), name))
        return tuple(execute(store, NEXT, (name,))[0])
''', "starts the counter again", "steps"),
    "the token handed out before its transaction commits": (_ISSUE + '''
def issue(store, authority, name, recovered):
    if store.conn.in_transaction:
        store.conn.execute("COMMIT")  # the previous token, at last
    store.conn.execute("BEGIN IMMEDIATE")
    if recovered:
        execute(store, "UPDATE epoch_counter SET epoch = ?, counter = 0 WHERE name = ?", (authority.next_epoch(name), name))
    return tuple(execute(store, NEXT, (name,))[0])
''', "committed in the store", "committed"),
    "a new epoch for every token": (_ISSUE + '''
def issue(store, authority, name, recovered):
    epoch = authority.next_epoch(name)
    with transaction(store):
        execute(store, "UPDATE epoch_counter SET epoch = ?, counter = 0 WHERE name = ?", (epoch, name))
        return tuple(execute(store, NEXT, (name,))[0])
''', "once per recovery", "once"),
    "the new epoch kept in Python, never written to the store": (_ISSUE + '''
EPOCH = {}
def issue(store, authority, name, recovered):
    if recovered:
        EPOCH[name] = authority.next_epoch(name)
    with transaction(store):
        epoch, counter = execute(store, NEXT, (name,))[0]
    return max(epoch, EPOCH.get(name, 0)), counter
''', "committed in the store", "committed"),
    "a constant token": ('''
def issue(store, authority, name, recovered):
    return (1, 1)
''', "every token is above", None),
}

# --------------------------------------------------------------------- 04.2 lease cleanup
_CLEAN = '''
from labkit.db import transaction, execute, rowcount
'''
CLEANUP_RIGHT = {
    "BEGIN IMMEDIATE by hand, DELETE ... RETURNING fetched before COMMIT": '''
def cleanup(conn, now):
    conn.execute("BEGIN IMMEDIATE")
    try:
        gone = conn.execute("DELETE FROM leases WHERE NOT (expires_at > :now) RETURNING name",
                            {"now": now}).fetchall()
        conn.execute("COMMIT")
    except BaseException:
        if conn.conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return len(gone)
''',
    "read the expired rows and delete each by its full identity, all under the write lock": _CLEAN + '''
def cleanup(conn, now):
    deleted = 0
    with transaction(conn):
        for name, generation in execute(conn, "SELECT name, generation FROM leases WHERE ? >= expires_at", (now,)):
            deleted += rowcount(conn, "DELETE FROM leases WHERE name = ? AND generation = ? AND expires_at <= ?",
                                (name, generation, now))
    return deleted
''',
}

CLEANUP_WRONG = {
    "deletes the counter with the lease (the lesson's naive cleanup)": (_CLEAN + '''
def cleanup(conn, now):
    with transaction(conn):
        names = [name for (name,) in execute(conn, "DELETE FROM leases WHERE expires_at <= ? RETURNING name", (now,))]
        for name in names:
            execute(conn, "DELETE FROM lease_counter WHERE name = ?", (name,))
    return len(names)
''', "above every generation ever issued", "counter"),
    "re-creates the counter at 1 for a fresh start": (_CLEAN + '''
def cleanup(conn, now):
    with transaction(conn):
        names = [name for (name,) in execute(conn, "DELETE FROM leases WHERE expires_at <= ? RETURNING name", (now,))]
        for name in names:
            execute(conn, "INSERT OR REPLACE INTO lease_counter(name, generation) VALUES (?, 1)", (name,))
    return len(names)
''', "above every generation ever issued", "counter"),
    "a lease at exactly its expiry counted as alive (expires_at < now)": (_CLEAN + '''
def cleanup(conn, now):
    with transaction(conn):
        return rowcount(conn, "DELETE FROM leases WHERE expires_at < ?", (now,))
''', "deletes every lease that has expired at now", "expired deleted"),
    "expired counted from now + ttl (deletes leases that still run)": (_CLEAN + '''
def cleanup(conn, now):
    with transaction(conn):
        return rowcount(conn, "DELETE FROM leases WHERE expires_at < ? + ttl", (now,))
''', "never deletes a lease that is unexpired at now", "live kept"),
    "read, then delete by name and owner (a re-acquire lands in between)": (_CLEAN + '''
def cleanup(conn, now):
    expired = execute(conn, "SELECT name, owner FROM leases WHERE expires_at <= ?", (now,))
    with transaction(conn):
        for name, owner in expired:
            execute(conn, "DELETE FROM leases WHERE name = ? AND owner = ?", (name, owner))
    return len(expired)
''', "never deletes a lease that is unexpired at now", "live kept"),
    "one autocommitted DELETE per expired name": (_CLEAN + '''
def cleanup(conn, now):
    names = [name for (name,) in execute(conn, "SELECT name FROM leases WHERE expires_at <= ?", (now,))]
    return sum(rowcount(conn, "DELETE FROM leases WHERE name = ? AND expires_at <= ?", (name, now)) for name in names)
''', "commit together, in one transaction", "one transaction"),
    "counts the expired rows first, outside the transaction that deletes them": (_CLEAN + '''
def cleanup(conn, now):
    (count,) = execute(conn, "SELECT count(*) FROM leases WHERE expires_at <= ?", (now,))[0]
    with transaction(conn):
        execute(conn, "DELETE FROM leases WHERE expires_at <= ?", (now,))
    return count
''', "returns how many lease rows it deleted", "count"),
    "a constant: reports nothing deleted": ('''
def cleanup(conn, now):
    return 0
''', "deletes every lease that has expired at now", None),
}

# --------------------------------------------------------------------- 03.3 protect a new resource
#: hand-written triggers, as protect installs them; each wrong answer below changes one thing
GUARD_HAND = '''
import labkit

CHECKED, RAISED = ("INSERT", "UPDATE"), ("INSERT", "UPDATE")
CHECK = """CREATE TRIGGER payouts_check_{event} BEFORE {event} ON payouts BEGIN SELECT CASE
    WHEN (NEW.epoch, NEW.counter) < (SELECT epoch, generation FROM job_fence WHERE job_id = NEW.job_id)
        THEN RAISE(ABORT, 'stale token')
    WHEN (NEW.epoch, NEW.counter) > (SELECT 0, generation FROM lease_counter WHERE name = NEW.job_id)
        THEN RAISE(ABORT, 'token never issued')
    END; END"""
RAISE = """CREATE TRIGGER payouts_raise_{event} AFTER {event} ON payouts BEGIN
    UPDATE job_fence SET epoch = NEW.epoch, generation = NEW.counter
    WHERE job_id = NEW.job_id AND (epoch, generation) < (NEW.epoch, NEW.counter); END"""


def protect_payouts(db, job):
    labkit.Fence(db, job)  # the job's fence row
    for event in CHECKED:
        db.execute(CHECK.format(event=event))
    for event in RAISED:
        db.execute(RAISE.format(event=event))
'''
_FENCE_ROW = "(SELECT epoch, generation FROM job_fence WHERE job_id = NEW.job_id)"


def _hand(old: str, new: str) -> str:
    assert old in GUARD_HAND, old
    return GUARD_HAND.replace(old, new, 1)


GUARD_RIGHT = {
    "Fence.protect on the token column": '''
import labkit
def protect_payouts(db, job):
    labkit.Fence(db, job).protect("payouts", "counter")
''',
    "hand-written triggers, as protect installs them": GUARD_HAND,
    "protect by keyword, the invoices too": '''
from labkit import Fence
def protect_payouts(db, job):
    fence = Fence(db, job)
    fence.protect(table="invoices")
    fence.protect(table="payouts", column="counter")
''',
}

GUARD_WRONG = {
    "compares with the table's own newest row, not the fence": (_hand(
        _FENCE_ROW, "(SELECT epoch, counter FROM payouts WHERE job_id = NEW.job_id "
        "ORDER BY epoch DESC, counter DESC LIMIT 1)"), "is refused", "stale"),
    "checks INSERT only, not UPDATE": (
        _hand('CHECKED, RAISED = ("INSERT", "UPDATE"),', 'CHECKED, RAISED = ("INSERT",),'),
        "raw UPDATE", "updates"),
    "compares the counter alone, ignoring the epoch": (
        _hand("(NEW.epoch, NEW.counter) < (SELECT epoch, generation", "NEW.counter < (SELECT generation"),
        "(2, 1)", "epochs"),
    "trusts any token: no check against the last one issued": (
        _hand("    WHEN (NEW.epoch, NEW.counter) > (SELECT 0, generation FROM lease_counter WHERE name = "
              "NEW.job_id)\n        THEN RAISE(ABORT, 'token never issued')\n", ""),
        "F's raw INSERT", "forged"),
    "refuses the token the fence already holds": (
        _hand("(NEW.epoch, NEW.counter) < (SELECT epoch", "(NEW.epoch, NEW.counter) <= (SELECT epoch"),
        "is kept as written", "holder"),
    "compares with the lease authority's last token, not the fence": (
        _hand(_FENCE_ROW, "(SELECT 0, generation FROM lease_counter WHERE name = NEW.job_id)"),
        "is kept as written", ("epochs", "holder")),
    "refuses but never raises the fence": (
        _hand('CHECKED, RAISED = ("INSERT", "UPDATE"), ("INSERT", "UPDATE")', 'CHECKED, RAISED = ("INSERT", "UPDATE"), ()'),
        "raised the fence", ("epochs", "holder")),
    "raises the fence but refuses nothing": (
        _hand('CHECKED, RAISED = ("INSERT", "UPDATE"), ("INSERT", "UPDATE")', 'CHECKED, RAISED = (), ("INSERT", "UPDATE")'),
        "is refused", ("stale", "updates", "epochs", "forged")),
    "protects the invoices instead": ('''
import labkit
def protect_payouts(db, job):
    labkit.Fence(db, job).protect("invoices")
''', "is refused", ("stale", "updates", "epochs", "forged", "holder")),
    "protect's default column, which payouts does not have": ('''
import labkit
def protect_payouts(db, job):
    labkit.Fence(db, job).protect("payouts")
''', "has no column 'generation'", None),
    "a constant: protects nothing": ('''
def protect_payouts(db, job):
    return None
''', "is refused", None),
}

CORPUS = {
    "01.1": {"name": "find_lost_updates", "right": LOST_RIGHT, "wrong": LOST_WRONG},
    "01.2": {"name": "predict_overwrite", "right": PREDICT_RIGHT, "wrong": PREDICT_WRONG},
    "02.1": {"name": "fenced_insert", "right": FENCED_RIGHT, "wrong": FENCED_WRONG},
    "02.2": {"name": "charge_once", "right": ONCE_RIGHT, "wrong": ONCE_WRONG},
    "03.1": {"name": "record_batch", "right": BATCH_RIGHT, "wrong": BATCH_WRONG},
    "03.2": {"name": "split_database_answers", "right": QUIZ_RIGHT, "wrong": QUIZ_WRONG},
    "03.3": {"name": "protect_payouts", "right": GUARD_RIGHT, "wrong": GUARD_WRONG},
    "04.1": {"name": "issue", "right": ISSUE_RIGHT, "wrong": ISSUE_WRONG},
    "04.2": {"name": "cleanup", "right": CLEANUP_RIGHT, "wrong": CLEANUP_WRONG},
}
