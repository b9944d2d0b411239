"""Answers to the tasks of lessons 05-09, as a student would type them into an answer cell.

``CORPUS[task]`` has the function's ``name`` and three dicts of source strings:
``right`` (correct answers in styles different from the solution's: they must
pass), ``wrong`` (known-wrong answers, each a mistake a lesson names, plus a
constant: they must fail, with ``expect`` a phrase of the property that breaks)
and the shared ``TAMPER`` prefixes (cells that rebind ``labkit.grading``).
"""

# --------------------------------------------------------------------- 05.1 deadline
DEADLINE_RIGHT = {
    "clamped at the send time (no negative window)": '''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return max(send_time, send_time + ttl * (1 - max_drift) - margin)
''',
    "named steps": '''
def conservative_deadline(send_time, ttl, margin, max_drift):
    worst_local_ttl = ttl - ttl * max_drift      # my clock may count only this much of the lease
    usable = worst_local_ttl - margin
    return send_time + usable
''',
}

DEADLINE_WRONG = {
    "no margin": ('''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return send_time + ttl * (1 - max_drift)
''', "leaves the margin"),
    "ignores drift": ('''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return send_time + ttl - margin
''', "leaves the margin"),
    "drift in the wrong direction": ('''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return send_time + ttl * (1 + max_drift) - margin
''', "leaves the margin"),
    "drift taken as seconds, not a fraction": ('''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return send_time + ttl - max_drift - margin
''', "leaves the margin"),
    "constant": ('''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return 0.0
''', "gives away no more of the lease"),
    "gives up at once (the send time)": ('''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return send_time
''', "gives away no more of the lease"),
}

# --------------------------------------------------------------------- 05.2 holder loop
HOLDER_RIGHT = {
    "renew before every unit, keep the later deadline": '''
from labkit.timing import conservative_deadline

def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    deadline = conservative_deadline(acquired_at, ttl, margin, max_drift)
    while clock.now() < deadline:
        if not work():
            return
        sent = clock.now()
        if renew():
            deadline = max(deadline, conservative_deadline(sent, ttl, margin, max_drift))
''',
    "stop at the first failed renewal, renew at two thirds": '''
from labkit.timing import conservative_deadline

def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    def until(sent):
        return conservative_deadline(sent, ttl, margin, max_drift)
    deadline, renew_at = until(acquired_at), acquired_at + (until(acquired_at) - acquired_at) * 2 / 3
    more = True
    while more and clock.now() < deadline:
        more = work()
        if more and clock.now() >= renew_at:
            sent = clock.now()
            if not renew():
                return                      # uncertain: stop at once (stricter than needed, still fine)
            deadline = until(sent)
            renew_at = sent + (deadline - sent) * 2 / 3
''',
}

_LOOP = '''
from labkit.timing import conservative_deadline

def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    deadline = conservative_deadline(acquired_at, ttl, margin, max_drift)
    window = deadline - acquired_at
    while clock.now() < deadline:
        if not work():
            return
        if deadline - clock.now() < window / 2:
            sent = clock.now()
            if renew():
                deadline = conservative_deadline(sent, ttl, margin, max_drift)
'''

HOLDER_WRONG = {
    "deadline counted from the response's arrival": (_LOOP.replace(
        "                deadline = conservative_deadline(sent, ttl, margin, max_drift)",
        "                deadline = conservative_deadline(clock.now(), ttl, margin, max_drift)"),
        "after the conservative deadline"),
    "no margin": (_LOOP.replace("conservative_deadline(acquired_at, ttl, margin, max_drift)",
                                "conservative_deadline(acquired_at, ttl, 0.0, max_drift)").replace(
        "conservative_deadline(sent, ttl, margin, max_drift)", "conservative_deadline(sent, ttl, 0.0, max_drift)"),
        "after the conservative deadline"),
    "ignores drift": (_LOOP.replace("ttl, margin, max_drift)\n", "ttl, margin, 0.0)\n"),
                      "after the conservative deadline"),
    "keeps working while renewal is uncertain": ('''
from labkit.timing import conservative_deadline

def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    deadline = conservative_deadline(acquired_at, ttl, margin, max_drift)
    while work():
        if deadline - clock.now() < ttl / 2:
            sent = clock.now()
            if renew():
                deadline = conservative_deadline(sent, ttl, margin, max_drift)
''', "after the conservative deadline"),
    "checks the deadline only when renewing": ('''
from labkit.timing import conservative_deadline

def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    deadline = conservative_deadline(acquired_at, ttl, margin, max_drift)
    while True:
        if deadline - clock.now() < ttl / 2:
            sent = clock.now()
            if not renew():
                return
            deadline = conservative_deadline(sent, ttl, margin, max_drift)
        if not work():
            return
''', "after the conservative deadline"),
    "never renews": ('''
from labkit.timing import conservative_deadline

def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    deadline = conservative_deadline(acquired_at, ttl, margin, max_drift)
    while clock.now() < deadline and work():
        pass
''', "finishes the job"),
    "does nothing (a constant)": ('''
def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    return None
''', "finishes the job"),
    "waits for time to pass on its own": ('''
from labkit.timing import conservative_deadline

def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    deadline = conservative_deadline(acquired_at, ttl, margin, max_drift)
    while clock.now() < deadline - ttl / 2:
        pass
''', "the holder loop ends"),
}

# --------------------------------------------------------------------- 06.1 release
RELEASE_RIGHT = {
    "sqlite-utils cursor, named parameters": '''
def release(db, name, owner, generation):
    cursor = db.execute(
        "DELETE FROM leases WHERE name = :n AND owner = :o AND generation = :g",
        {"n": name, "o": owner, "g": generation})
    return cursor.rowcount == 1
''',
    "RETURNING inside an explicit transaction": '''
from labkit.db import transaction, execute

def release(db, name, owner, generation):
    with transaction(db):
        gone = execute(db, """DELETE FROM leases
                              WHERE (name, owner, generation) = (?, ?, ?)
                              RETURNING generation""", (name, owner, generation))
    return len(gone) > 0
''',
    "read and delete under BEGIN IMMEDIATE (the lock keeps the world still)": '''
from labkit.db import transaction, execute

def release(db, name, owner, generation):
    with transaction(db):
        row = execute(db, "SELECT owner, generation FROM leases WHERE name = ?", (name,))
        if row != [(owner, generation)]:
            return False
        execute(db, "DELETE FROM leases WHERE name = ? AND owner = ? AND generation = ?",
                (name, owner, generation))
        return True
''',
}

RELEASE_WRONG = {
    "checks only the owner": ('''
from labkit.db import rowcount

def release(db, name, owner, generation):
    return rowcount(db, "DELETE FROM leases WHERE name = ? AND owner = ?", (name, owner)) == 1
''', "answers False when A re-acquired"),
    "checks only the generation": ('''
from labkit.db import rowcount

def release(db, name, owner, generation):
    return rowcount(db, "DELETE FROM leases WHERE name = ? AND generation = ?", (name, generation)) == 1
''', "presents A's generation"),
    "deletes by name (no check at all)": ('''
from labkit.db import rowcount

def release(db, name, owner, generation):
    return rowcount(db, "DELETE FROM leases WHERE name = ?", (name,)) == 1
''', "answers False when"),
    "read, compare in Python, then delete by name": ('''
from labkit.db import execute

def release(db, name, owner, generation):
    rows = execute(db, "SELECT owner, generation FROM leases WHERE name = ?", (name,))
    if rows and rows[0] == (owner, generation):
        execute(db, "DELETE FROM leases WHERE name = ?", (name,))
        return True
    return False
''', "took over between the release's statements"),
    "forgets the lease's name": ('''
from labkit.db import rowcount

def release(db, name, owner, generation):
    return rowcount(db, "DELETE FROM leases WHERE owner = ? AND generation = ?", (owner, generation)) > 0
''', "deletes the caller's lease only"),
    "deletes the generation counter too": ('''
from labkit.db import rowcount

def release(db, name, owner, generation):
    n = rowcount(db, "DELETE FROM leases WHERE name = ? AND owner = ? AND generation = ?",
                 (name, owner, generation))
    rowcount(db, "DELETE FROM lease_counter WHERE name = ?", (name,))
    return n == 1
''', "never touches the permanent generation counter"),
    "constant True": ('''
def release(db, name, owner, generation):
    return True
''', "deletes the caller's lease only"),
}

# --------------------------------------------------------------------- 06.2 backoff
BACKOFF_RIGHT = {
    "equal jitter (half fixed, half random)": '''
def backoff(attempt, *, base, cap, rng):
    ceiling = min(cap, base * 2 ** attempt)
    return ceiling / 2 + rng.uniform(0, ceiling / 2)
''',
    "full jitter with rng.random() and a loop": '''
def backoff(attempt, *, base, cap, rng):
    ceiling = base
    for _ in range(attempt):
        ceiling *= 2
        if ceiling >= cap:
            break
    return rng.random() * min(ceiling, cap)
''',
}

BACKOFF_WRONG = {
    "no jitter": ('''
def backoff(attempt, *, base, cap, rng):
    return min(cap, base * 2 ** attempt)
''', "delays are jittered"),
    "jitter from the global random": ('''
import random

def backoff(attempt, *, base, cap, rng):
    return random.uniform(0, min(cap, base * 2 ** attempt))
''', "the same seed gives the same delay"),
    "no cap": ('''
def backoff(attempt, *, base, cap, rng):
    return rng.uniform(0, base * 2 ** attempt)
''', "every delay lies in"),
    "its own fixed-seed rng": ('''
import random

def backoff(attempt, *, base, cap, rng):
    return random.Random(42).uniform(0, min(cap, base * 2 ** attempt))
''', "delays are jittered"),
    "linear growth": ('''
def backoff(attempt, *, base, cap, rng):
    return rng.uniform(0, min(cap, base * (attempt + 1)))
''', "exponential growth"),
    "jitter added on top of the ceiling": ('''
def backoff(attempt, *, base, cap, rng):
    return min(cap, base * 2 ** attempt) + rng.uniform(0, base)
''', "every delay lies in"),
    "constant": ('''
def backoff(attempt, *, base, cap, rng):
    return 0.5
''', "every delay lies in"),
}

CORPUS = {
    "05.1": {"name": "conservative_deadline", "right": DEADLINE_RIGHT, "wrong": DEADLINE_WRONG},
    "05.2": {"name": "keep_working", "right": HOLDER_RIGHT, "wrong": HOLDER_WRONG},
    "06.1": {"name": "release", "right": RELEASE_RIGHT, "wrong": RELEASE_WRONG},
    "06.2": {"name": "backoff", "right": BACKOFF_RIGHT, "wrong": BACKOFF_WRONG},
}

# An answer cell that tampers with the grader, then defines a wrong answer.
TAMPER = {
    "rebinds check to print the pass line": '''
import labkit.grading
labkit.grading.check = lambda task_id, answer: print(f"PASS {task_id}: anything held under every schedule")
''',
    "clears the registered tasks": '''
import labkit.grading
labkit.grading.TASKS.clear()
''',
    "patches expect to do nothing": '''
import labkit.grading
labkit.grading.expect = lambda *args, **kwargs: None
''',
    "patches the task's trial to do nothing": '''
import labkit.grading
for t in list(labkit.grading.TASKS.values()):
    labkit.grading.TASKS[t.id] = t.__class__(t.id, t.title, lambda *a: None, t.schedules)
''',
}
