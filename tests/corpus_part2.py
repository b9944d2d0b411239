"""Answers to the tasks of lessons 05-09, as a student would type them into an answer cell.

``CORPUS[task]`` has the function's ``name`` and two dicts of source strings:
``right`` (correct answers in styles different from the solution's: they must
pass) and ``wrong`` (known-wrong answers, each a mistake a lesson names, plus a
constant: they must fail, with ``expect`` a phrase of the property that breaks).
The answer-cell prefixes that tamper with the grader are in tests/answers.py.
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
''', "leaves the margin", "margin"),
    "ignores drift": ('''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return send_time + ttl - margin
''', "leaves the margin", "margin"),
    "drift in the wrong direction": ('''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return send_time + ttl * (1 + max_drift) - margin
''', "leaves the margin", "margin"),
    "drift taken as seconds, not a fraction": ('''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return send_time + ttl - max_drift - margin
''', "leaves the margin", "margin"),
    "constant": ('''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return 0.0
''', "gives away no more of the lease", None),
    "gives up at once (the send time)": ('''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return send_time
''', "gives away no more of the lease", None),  # it does nothing: it scores nothing
    "the margin subtracted twice": ('''
def conservative_deadline(send_time, ttl, margin, max_drift):
    return send_time + ttl * (1 - max_drift) - 2 * margin
''', "gives away no more of the lease", "tight"),
}

# --------------------------------------------------------------------- 05.2 holder loop
HOLDER_RIGHT = {
    "renew before every unit, keep the later deadline": '''
from labkit.mechanisms.timing import conservative_deadline

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
from labkit.mechanisms.timing import conservative_deadline

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
from labkit.mechanisms.timing import conservative_deadline

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
        "after the conservative deadline", "deadline"),
    "no margin": (_LOOP.replace("conservative_deadline(acquired_at, ttl, margin, max_drift)",
                                "conservative_deadline(acquired_at, ttl, 0.0, max_drift)").replace(
        "conservative_deadline(sent, ttl, margin, max_drift)", "conservative_deadline(sent, ttl, 0.0, max_drift)"),
        "after the conservative deadline", "deadline"),
    "ignores drift": (_LOOP.replace("ttl, margin, max_drift)\n", "ttl, margin, 0.0)\n"),
                      "after the conservative deadline", "deadline"),
    "keeps working while renewal is uncertain": ('''
from labkit.mechanisms.timing import conservative_deadline

def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    deadline = conservative_deadline(acquired_at, ttl, margin, max_drift)
    while work():
        if deadline - clock.now() < ttl / 2:
            sent = clock.now()
            if renew():
                deadline = conservative_deadline(sent, ttl, margin, max_drift)
''', "after the conservative deadline", "deadline"),
    "checks the deadline only when renewing": ('''
from labkit.mechanisms.timing import conservative_deadline

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
''', "after the conservative deadline", "deadline"),
    "never renews": ('''
from labkit.mechanisms.timing import conservative_deadline

def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    deadline = conservative_deadline(acquired_at, ttl, margin, max_drift)
    while clock.now() < deadline and work():
        pass
''', "finishes the job", "finishes"),
    "does nothing (a constant)": ('''
def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    return None
''', "finishes the job", None),
    "waits for time to pass on its own (never works: scores nothing)": ('''
from labkit.mechanisms.timing import conservative_deadline

def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    deadline = conservative_deadline(acquired_at, ttl, margin, max_drift)
    while clock.now() < deadline - ttl / 2:
        pass
''', "the holder loop ends", None),
    "keeps renewing until a renewal is confirmed": ('''
from labkit.mechanisms.timing import conservative_deadline

def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):
    deadline = conservative_deadline(acquired_at, ttl, margin, max_drift)
    window = deadline - acquired_at
    while True:
        if clock.now() < deadline and not work():
            return
        if deadline - clock.now() < window / 2:
            sent = clock.now()
            if renew():
                deadline = conservative_deadline(sent, ttl, margin, max_drift)
''', "keeps renewing without working or stopping", "ends"),
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
''', "answers False when A re-acquired", ("answers", "own only")),
    "checks only the generation": ('''
from labkit.db import rowcount

def release(db, name, owner, generation):
    return rowcount(db, "DELETE FROM leases WHERE name = ? AND generation = ?", (name, generation)) == 1
''', "presents A's generation", ("answers", "own only")),
    "deletes by name (no check at all)": ('''
from labkit.db import rowcount

def release(db, name, owner, generation):
    return rowcount(db, "DELETE FROM leases WHERE name = ?", (name,)) == 1
''', "answers False when", ("answers", "own only", "race")),
    "read, compare in Python, then delete by name": ('''
from labkit.db import execute

def release(db, name, owner, generation):
    rows = execute(db, "SELECT owner, generation FROM leases WHERE name = ?", (name,))
    if rows and rows[0] == (owner, generation):
        execute(db, "DELETE FROM leases WHERE name = ?", (name,))
        return True
    return False
''', "took over between the release's statements", "race"),
    "forgets the lease's name": ('''
from labkit.db import rowcount

def release(db, name, owner, generation):
    return rowcount(db, "DELETE FROM leases WHERE owner = ? AND generation = ?", (owner, generation)) > 0
''', "deletes the caller's lease only", "own only"),
    "deletes the generation counter too": ('''
from labkit.db import rowcount

def release(db, name, owner, generation):
    n = rowcount(db, "DELETE FROM leases WHERE name = ? AND owner = ? AND generation = ?",
                 (name, owner, generation))
    rowcount(db, "DELETE FROM lease_counter WHERE name = ?", (name,))
    return n == 1
''', "never touches the permanent generation counter", "counter"),
    "constant True": ('''
def release(db, name, owner, generation):
    return True
''', "deletes the caller's lease only", None),
    "constant False": ('''
def release(db, name, owner, generation):
    return False
''', "answers True when A releases its own live lease", None),
    "releasing nothing counts as released": ('''
from labkit.db import execute, rowcount

def release(db, name, owner, generation):
    if rowcount(db, "DELETE FROM leases WHERE name = ? AND owner = ? AND generation = ?",
                (name, owner, generation)) == 1:
        return True
    return not execute(db, "SELECT 1 FROM leases WHERE name = ?", (name,))  # nothing held: done
''', "answers False when nothing is held", "answers"),
}

# --------------------------------------------------------------------- 06.2 backoff
BACKOFF_RIGHT = {
    "a bit shift, scaled by rng.random()": '''
def backoff(attempt, *, base, cap, rng):
    return min(cap, base * (1 << attempt)) * rng.random()
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
''', "delays are jittered", "full jitter"),
    "jitter from the global random": ('''
import random

def backoff(attempt, *, base, cap, rng):
    return random.uniform(0, min(cap, base * 2 ** attempt))
''', "the same seed gives the same delay", "rng"),
    "no cap": ('''
def backoff(attempt, *, base, cap, rng):
    return rng.uniform(0, base * 2 ** attempt)
''', "every delay lies in", "range"),
    "its own fixed-seed rng": ('''
import random

def backoff(attempt, *, base, cap, rng):
    return random.Random(42).uniform(0, min(cap, base * 2 ** attempt))
''', "delays are jittered", ("full jitter", "growth")),
    "linear growth": ('''
def backoff(attempt, *, base, cap, rng):
    return rng.uniform(0, min(cap, base * (attempt + 1)))
''', "exponential growth", "growth"),
    "jitter added on top of the ceiling": ('''
def backoff(attempt, *, base, cap, rng):
    return min(cap, base * 2 ** attempt) + rng.uniform(0, base)
''', "every delay lies in", ("range", "full jitter")),
    "equal jitter (half fixed, half random)": ('''
def backoff(attempt, *, base, cap, rng):
    ceiling = min(cap, base * 2 ** attempt)
    return ceiling / 2 + rng.uniform(0, ceiling / 2)
''', "full jitter", "full jitter"),
    "constant": ('''
def backoff(attempt, *, base, cap, rng):
    return 0.5
''', "every delay lies in", None),
}

# --------------------------------------------------------------------- 06.3 version wait
_SEEN = 'SELECT version, duration FROM version_leases WHERE name = ?'
_CLAIM = '''
    with transaction(db):
        won = execute(db, """UPDATE version_leases
                             SET owner = ?, generation = generation + 1, version = version + 1
                             WHERE name = ? AND version = ? RETURNING generation""",
                      (me, name, version))
    return won[0][0] if won else None
'''
_WAITED = f'''
from labkit.db import execute, transaction

def claim_quiet_lease(db, name, me, *, wait):
    while True:
        version, duration = execute(db, "{_SEEN}", (name,))[0]
        if wait(WAIT):
            break
''' + _CLAIM

VERSION_RIGHT = {
    "rowcount, owner and generation checked too": '''
from labkit.db import execute, rowcount

def claim_quiet_lease(db, name, me, *, wait):
    seen = None
    while seen is None:
        owner, generation, version, duration = execute(
            db, "SELECT owner, generation, version, duration FROM version_leases WHERE name = ?",
            (name,))[0]
        seen = (owner, generation, version) if wait(duration) else None
    n = rowcount(db, """UPDATE version_leases
                        SET owner = :me, generation = generation + 1, version = version + 1
                        WHERE name = :name AND owner IS :owner AND generation = :g AND version = :v""",
                 {"me": me, "name": name, "owner": owner, "g": generation, "v": version})
    return generation + 1 if n == 1 else None
''',
    "waits in quarters, starting over from a fresh read after a drop": _WAITED.replace(
        "if wait(WAIT):", "if all(wait(duration / 4) for _ in range(4)):"),
    "compares again under BEGIN IMMEDIATE (the lock keeps the world still)": f'''
from labkit.db import execute, transaction

def claim_quiet_lease(db, name, me, *, wait):
    seen, duration = execute(db, "{_SEEN}", (name,))[0]
    while not wait(duration):  # dropped: read again, and wait a whole duration from there
        seen, duration = execute(db, "{_SEEN}", (name,))[0]
    with transaction(db):
        (now,) = execute(db, "SELECT version FROM version_leases WHERE name = ?", (name,))[0]
        if now != seen:
            return None
        execute(db, "UPDATE version_leases SET owner = ?, generation = generation + 1, "
                    "version = version + 1 WHERE name = ?", (me, name))
        return execute(db, "SELECT generation FROM version_leases WHERE name = ?", (name,))[0][0]
''',
}

VERSION_WRONG = {
    "a wait capped at 30 s": (_WAITED.replace("WAIT", "min(duration, 30)"), "unbroken wait",
                              "full duration"),
    "ignores a dropped wait": (f'''
from labkit.db import execute, transaction

def claim_quiet_lease(db, name, me, *, wait):
    version, duration = execute(db, "{_SEEN}", (name,))[0]
    wait(duration)
''' + _CLAIM, "after a dropped wait", "reconnect"),
    "after a drop, waits again without reading again": (f'''
from labkit.db import execute, transaction

def claim_quiet_lease(db, name, me, *, wait):
    version, duration = execute(db, "{_SEEN}", (name,))[0]
    while not wait(duration):
        pass
''' + _CLAIM, "after a dropped wait", "reconnect"),
    "gives up after a dropped wait": (f'''
from labkit.db import execute, transaction

def claim_quiet_lease(db, name, me, *, wait):
    version, duration = execute(db, "{_SEEN}", (name,))[0]
    if not wait(duration):
        return None
''' + _CLAIM, "after a dropped wait", "reconnect"),
    "reads the version again after the wait and claims on that": (_WAITED.replace(
        "WAIT", "duration").replace("    with transaction(db):\n", """    with transaction(db):
        (version,) = execute(db, "SELECT version FROM version_leases WHERE name = ?", (name,))[0]
"""), "moved during the wait", "unchanged version"),
    "claims by name after the wait (no version check)": (_WAITED.replace("WAIT", "duration")
        .replace("WHERE name = ? AND version = ?", "WHERE name = ?").replace("(me, name, version)", "(me, name)"),
        "moved during the wait", ("unchanged version", "race")),
    "reads again, compares in Python, then writes by name": (f'''
from labkit.db import execute

def claim_quiet_lease(db, name, me, *, wait):
    while True:
        version, duration = execute(db, "{_SEEN}", (name,))[0]
        if wait(duration):
            break
    (now,) = execute(db, "SELECT version FROM version_leases WHERE name = ?", (name,))[0]
    if now != version:
        return None
    won = execute(db, "UPDATE version_leases SET owner = ?, generation = generation + 1, "
                      "version = version + 1 WHERE name = ? RETURNING generation", (me, name))
    return won[0][0] if won else None
''', "between the claim's statements", "race"),
    "bumps the version, not the generation": (_WAITED.replace("WAIT", "duration").replace(
        "SET owner = ?, generation = generation + 1, version", "SET owner = ?, version"),
        "next generation", "claims"),
    "holds the write lock through the wait": (f'''
from labkit.db import execute, transaction

def claim_quiet_lease(db, name, me, *, wait):
    with transaction(db):  # nobody can change the record while we wait... nor heartbeat
        version, duration = execute(db, "{_SEEN}", (name,))[0]
        wait(duration)
        won = execute(db, "UPDATE version_leases SET owner = ?, generation = generation + 1, "
                          "version = version + 1 WHERE name = ? AND version = ? "
                          "RETURNING generation", (me, name, version))
    return won[0][0] if won else None
''', "moved during the wait", ("unchanged version", "reconnect")),
    "retries until it wins (a live holder: it never returns)": (f'''
from labkit.db import execute, transaction

def claim_quiet_lease(db, name, me, *, wait):
    while True:
        version, duration = execute(db, "{_SEEN}", (name,))[0]
        if not wait(duration):
            continue
        with transaction(db):
            won = execute(db, "UPDATE version_leases SET owner = ?, generation = generation + 1, "
                              "version = version + 1 WHERE name = ? AND version = ? "
                              "RETURNING generation", (me, name, version))
        if won:
            return won[0][0]
''', "waits past 12 durations", None),
    "constant None": ('''
def claim_quiet_lease(db, name, me, *, wait):
    return None
''', "is claimed", None),
}

# --------------------------------------------------------------------- 07.1 sweeper
SWEEP_RIGHT = {
    "one conditional UPDATE ... RETURNING for all of them": '''
from labkit.db import execute

def sweep(db, now, older_than):
    rows = execute(db, \"\"\"UPDATE claims SET owner = NULL, state = 'queued', version = version + 1,
                                  updated_at = :now
                           WHERE state = 'claimed' AND updated_at <= :cutoff RETURNING job\"\"\",
                   {"now": now, "cutoff": now - older_than})
    return [job for (job,) in rows]
''',
    "read the candidates, requeue each if owner, generation and progress are unchanged": '''
from labkit.db import execute, rowcount

def sweep(db, now, older_than):
    seen = execute(db, "SELECT job, owner, generation, progress, updated_at FROM claims "
                       "WHERE state = 'claimed' AND updated_at <= ?", (now - older_than,))
    requeued = []
    for job, owner, generation, progress, updated_at in seen:
        n = rowcount(db, "UPDATE claims SET state = 'queued', owner = NULL WHERE job = ? AND state = 'claimed' "
                         "AND owner = ? AND generation = ? AND progress = ? AND updated_at = ?",
                     (job, owner, generation, progress, updated_at))
        if n:
            requeued.append(job)
    return requeued
''',
}

SWEEP_WRONG = {
    "requeues by age alone": ('''
from labkit.db import execute

def sweep(db, now, older_than):
    rows = execute(db, "UPDATE claims SET owner = NULL, state = 'queued' WHERE updated_at <= ? RETURNING job",
                   (now - older_than,))
    return [job for (job,) in rows]
''', "finished alone", "leaves others"),
    "read, then update by job": ('''
from labkit.db import execute

def sweep(db, now, older_than):
    stale = execute(db, "SELECT job FROM claims WHERE state = 'claimed' AND updated_at <= ?", (now - older_than,))
    for (job,) in stale:
        execute(db, "UPDATE claims SET owner = NULL, state = 'queued' WHERE job = ?", (job,))
    return [job for (job,) in stale]
''', "moved on after it was read", "unchanged only"),
    "checks the state again but not that the claim is unchanged": ('''
from labkit.db import execute, rowcount

def sweep(db, now, older_than):
    stale = execute(db, "SELECT job FROM claims WHERE state = 'claimed' AND updated_at <= ?", (now - older_than,))
    return [job for (job,) in stale
            if rowcount(db, "UPDATE claims SET owner = NULL, state = 'queued' WHERE job = ? AND state = 'claimed'",
                        (job,))]
''', "moved on after it was read", "unchanged only"),
    "requeues finished claims too": ('''
from labkit.db import execute

def sweep(db, now, older_than):
    rows = execute(db, "UPDATE claims SET owner = NULL, state = 'queued' WHERE state != 'queued' "
                       "AND updated_at <= ? RETURNING job", (now - older_than,))
    return [job for (job,) in rows]
''', "finished alone", "leaves others"),
    "throws the progress away": ('''
from labkit.db import execute

def sweep(db, now, older_than):
    rows = execute(db, "UPDATE claims SET owner = NULL, state = 'queued', progress = 0 "
                       "WHERE state = 'claimed' AND updated_at <= ? RETURNING job", (now - older_than,))
    return [job for (job,) in rows]
''', "keeping its progress", "keeps progress"),
    "leaves the owner set": ('''
from labkit.db import execute

def sweep(db, now, older_than):
    rows = execute(db, "UPDATE claims SET state = 'queued' WHERE state = 'claimed' AND updated_at <= ? "
                       "RETURNING job", (now - older_than,))
    return [job for (job,) in rows]
''', "has its owner cleared", "owner cleared"),
    "requeues only the oldest claim each run": ('''
from labkit.db import execute

def sweep(db, now, older_than):
    rows = execute(db, """UPDATE claims SET owner = NULL, state = 'queued', version = version + 1
                           WHERE job = (SELECT job FROM claims WHERE state = 'claimed' AND updated_at <= ?
                                        ORDER BY updated_at LIMIT 1) RETURNING job""", (now - older_than,))
    return [job for (job,) in rows]
''', "requeues every claim unfinished", "requeues old"),
    "returns the candidates it read, not those it requeued": ('''
from labkit.db import execute, rowcount

def sweep(db, now, older_than):
    seen = execute(db, "SELECT job, version FROM claims WHERE state = 'claimed' AND updated_at <= ?",
                   (now - older_than,))
    for job, version in seen:
        rowcount(db, "UPDATE claims SET owner = NULL, state = 'queued', version = version + 1 "
                     "WHERE job = ? AND state = 'claimed' AND version = ?", (job, version))
    return [job for job, _ in seen]
''', "returns the jobs it requeued", "returns jobs"),
    "constant": ('''
def sweep(db, now, older_than):
    return []
''', "requeues every claim unfinished", None),
}

# --------------------------------------------------------------------- 07.2 resume
RESUME_RIGHT = {
    "labkit.mechanisms.recovery.produce per unit, checkpoint on the batch's last unit": '''
from labkit import Fence
from labkit.mechanisms.recovery import produce

def run_job(claims, claim, units, issue_invoice, *, every):
    from labkit import run_once
    from labkit.mechanisms.recovery import operation_key
    fence = Fence(claims.db, claim.job)
    for i, (unit, amount) in enumerate(units):
        if i < claim.progress:
            continue
        with fence.guard(claim.generation) as tx:
            run_once(tx, operation_key(claim.job, unit), lambda tx, u=unit, a=amount: issue_invoice(tx, u, a),
                     payload=[unit, amount])
            done = i + 1
            if done % every == 0 or done == len(units):
                claims.checkpoint(claim, done, tx=tx)
    claims.finish(claim)
''',
    "own key table with INSERT ... ON CONFLICT DO NOTHING, replaying from the first unit": '''
from labkit import Fence

def run_job(claims, claim, units, issue_invoice, *, every):
    fence = Fence(claims.db, claim.job)
    for i, (unit, amount) in enumerate(units, start=1):
        with fence.guard(claim.generation) as tx:
            tx.execute("CREATE TABLE IF NOT EXISTS done_units (key TEXT PRIMARY KEY)")
            fresh = tx.execute("INSERT INTO done_units VALUES (?) ON CONFLICT DO NOTHING RETURNING key",
                               (claim.job + ":" + unit,))
            if fresh:
                issue_invoice(tx, unit, amount)
            if i > claim.progress and (i % every == 0 or i == len(units)):
                claims.checkpoint(claim, i, tx=tx)
    claims.finish(claim)
''',
}

_RESUME = '''
from labkit import Fence, run_once

def run_job(claims, claim, units, issue_invoice, *, every):
    fence = Fence(claims.db, claim.job)
    for i in range(claim.progress, len(units)):
        unit, amount = units[i]
        with fence.guard(claim.generation) as tx:
            EFFECT
            if (i + 1) % every == 0 or i + 1 == len(units):
                claims.checkpoint(claim, i + 1, tx=tx)
    claims.finish(claim)
'''

RESUME_WRONG = {
    "no operation id": (_RESUME.replace("EFFECT", "issue_invoice(tx, unit, amount)"), "never repeats an invoice", "no repeat"),
    "the generation in the operation id": (_RESUME.replace(
        "EFFECT", "run_once(tx, f'{claim.job}/{unit}@{claim.generation}', lambda tx: issue_invoice(tx, unit, amount))"),
        "never repeats an invoice", "no repeat"),
    "a fresh operation id per attempt": (_RESUME.replace(
        "EFFECT", "import uuid; run_once(tx, str(uuid.uuid4()), lambda tx: issue_invoice(tx, unit, amount))"),
        "never repeats an invoice", "no repeat"),
    "checkpoint after every unit, in its own transaction first": ('''
from labkit import Fence

def run_job(claims, claim, units, issue_invoice, *, every):
    fence = Fence(claims.db, claim.job)
    for i in range(claim.progress, len(units)):
        unit, amount = units[i]
        if (i + 1) % every == 0 or i + 1 == len(units):
            claims.checkpoint(claim, i + 1)
        with fence.guard(claim.generation) as tx:
            issue_invoice(tx, unit, amount)
    claims.finish(claim)
''', "the checkpoint commits in the fenced transaction", ("checkpoint in tx", "every unit", "no repeat")),
    "no fence at all: an unfenced transaction per unit": ('''
from labkit import run_once
from labkit.fence import unfenced

def run_job(claims, claim, units, issue_invoice, *, every):
    for i in range(claim.progress, len(units)):
        unit, amount = units[i]
        with unfenced(claims.db, claim.generation) as tx:
            run_once(tx, f"{claim.job}/{unit}", lambda tx: issue_invoice(tx, unit, amount))
            if (i + 1) % every == 0 or i + 1 == len(units):
                claims.checkpoint(claim, i + 1, tx=tx)
    claims.finish(claim)
''', "refused by the fence", "stale refused"),
    "the checkpoint in its own transaction, after the unit's": ('''
from labkit import Fence, run_once

def run_job(claims, claim, units, issue_invoice, *, every):
    fence = Fence(claims.db, claim.job)
    for i in range(claim.progress, len(units)):
        unit, amount = units[i]
        with fence.guard(claim.generation) as tx:
            run_once(tx, f"{claim.job}/{unit}", lambda tx: issue_invoice(tx, unit, amount))
        if (i + 1) % every == 0 or i + 1 == len(units):
            claims.checkpoint(claim, i + 1)
    claims.finish(claim)
''', "the checkpoint commits in the fenced transaction", "checkpoint in tx"),
    "every unit in one fenced transaction": ('''
from labkit import Fence, run_once

def run_job(claims, claim, units, issue_invoice, *, every):
    with Fence(claims.db, claim.job).guard(claim.generation) as tx:
        for i in range(claim.progress, len(units)):
            unit, amount = units[i]
            run_once(tx, f"{claim.job}/{unit}", lambda tx: issue_invoice(tx, unit, amount))
            if (i + 1) % every == 0 or i + 1 == len(units):
                claims.checkpoint(claim, i + 1, tx=tx)
    claims.finish(claim)
''', "each invoice commits in its own fenced transaction", "own transaction"),
    "a checkpoint after every unit": (_RESUME.replace(
        "EFFECT", "run_once(tx, f'{claim.job}/{unit}', lambda tx: issue_invoice(tx, unit, amount))").replace(
        "if (i + 1) % every == 0 or i + 1 == len(units):", "if True:"),
        "at most once per", "checkpoints rarely"),
    "resumes one unit past the checkpoint": (_RESUME.replace(
        "EFFECT", "run_once(tx, f'{claim.job}/{unit}', lambda tx: issue_invoice(tx, unit, amount))").replace(
        "range(claim.progress, len(units))", "range(claim.progress + 1, len(units))"),
        "every unit gets its invoice", "every unit"),
    "never marks the claim done": (_RESUME.replace(
        "EFFECT", "run_once(tx, f'{claim.job}/{unit}', lambda tx: issue_invoice(tx, unit, amount))").replace(
        "    claims.finish(claim)\n", ""),
        "the job ends done", "finishes"),
    "constant": ('''
def run_job(claims, claim, units, issue_invoice, *, every):
    return None
''', "every unit gets its invoice", None),
}

# --------------------------------------------------------------------- 08.1 relay
RELAY_RIGHT = {
    "labkit.db helpers, RETURNING on the mark": '''
import json
from labkit.db import execute, transaction

def relay(db, mail):
    for key, payload in execute(db, "SELECT key, payload FROM outbox WHERE kind = 'email' AND state = 'pending'"):
        email = json.loads(payload)
        delivery = mail.send(email["to"], email["subject"], email["body"], idempotency_key=key)
        with transaction(db):
            execute(db, "UPDATE outbox SET state = 'sent', provider_id = ? WHERE key = ? AND state = 'pending' "
                        "RETURNING key", (delivery.id, key))
''',
    "keeps going after a failed send (the row stays pending)": '''
import json

def relay(db, mail):
    rows = db.execute("SELECT key, payload FROM outbox WHERE kind = 'email' AND state = 'pending'").fetchall()
    for key, payload in rows:
        e = json.loads(payload)
        try:
            d = mail.send(e["to"], e["subject"], e["body"], idempotency_key=key)
        except Exception:
            continue
        db.execute("UPDATE outbox SET state = 'sent', provider_id = ? WHERE key = ?", [d.id, key])
''',
}

RELAY_WRONG = {
    "no idempotency key": ('''
import json
from labkit.db import execute

def relay(db, mail):
    for key, payload in execute(db, "SELECT key, payload FROM outbox WHERE kind = 'email' AND state = 'pending'"):
        e = json.loads(payload)
        d = mail.send(e["to"], e["subject"], e["body"])
        execute(db, "UPDATE outbox SET state = 'sent', provider_id = ? WHERE key = ?", (d.id, key))
''', "reaches the provider once", "never twice"),
    "marks sent before sending": ('''
import json
from labkit.db import execute

def relay(db, mail):
    for key, payload in execute(db, "SELECT key, payload FROM outbox WHERE kind = 'email' AND state = 'pending'"):
        e = json.loads(payload)
        execute(db, "UPDATE outbox SET state = 'sent' WHERE key = ?", (key,))
        mail.send(e["to"], e["subject"], e["body"], idempotency_key=key)
''', "every committed email intent is delivered", "never lost"),
    "resends every row, without a key": ('''
import json
from labkit.db import execute

def relay(db, mail):
    for key, payload in execute(db, "SELECT key, payload FROM outbox WHERE kind = 'email'"):
        e = json.loads(payload)
        mail.send(e["to"], e["subject"], e["body"])
        execute(db, "UPDATE outbox SET state = 'sent' WHERE key = ?", (key,))
''', "reaches the provider once", "never twice"),
    "a fresh key per attempt": ('''
import json, uuid
from labkit.db import execute

def relay(db, mail):
    for key, payload in execute(db, "SELECT key, payload FROM outbox WHERE kind = 'email' AND state = 'pending'"):
        e = json.loads(payload)
        mail.send(e["to"], e["subject"], e["body"], idempotency_key=str(uuid.uuid4()))
        execute(db, "UPDATE outbox SET state = 'sent' WHERE key = ?", (key,))
''', "reaches the provider once", "never twice"),
    "never marks the rows sent": ('''
import json
from labkit.db import execute

def relay(db, mail):
    for key, payload in execute(db, "SELECT key, payload FROM outbox WHERE kind = 'email' AND state = 'pending'"):
        e = json.loads(payload)
        mail.send(e["to"], e["subject"], e["body"], idempotency_key=key)
''', "every delivered intent is marked sent", "marked sent"),
    "marks every pending row sent at the end": ('''
import json
from labkit.db import execute

def relay(db, mail):
    for key, payload in execute(db, "SELECT key, payload FROM outbox WHERE kind = 'email' AND state = 'pending'"):
        e = json.loads(payload)
        mail.send(e["to"], e["subject"], e["body"], idempotency_key=key)
    execute(db, "UPDATE outbox SET state = 'sent' WHERE state = 'pending'")
''', "leaves other kinds of intent alone", "others alone"),
    "constant": ('''
def relay(db, mail):
    return 3
''', "every committed email intent is delivered", None),
}

# --------------------------------------------------------------------- 08.2 publish
PUBLISH_RIGHT = {
    "intent first, then the file, both in the guard": '''
def publish_report(generation, *, fence, files, outbox, mail, report, email):
    with fence.guard(generation) as tx:
        outbox.add(tx, "report-email:" + fence.job, "email", dict(email))
        files.write("report.txt", report, generation, tx=tx)
    return True
''',
    "catches the stale error and answers False": '''
from labkit import StaleGeneration

def publish_report(generation, *, fence, files, outbox, mail, report, email):
    try:
        with fence.guard(generation) as tx:
            files.write("report.txt", report, generation, tx=tx)
            outbox.add(tx, f"{fence.job}/report-email", "email", email)
    except StaleGeneration:
        return False
    return True
''',
}

PUBLISH_WRONG = {
    "sends it directly too, after the commit, under the intent's key": ('''
def publish_report(generation, *, fence, files, outbox, mail, report, email):
    key = "report-email:" + fence.job
    with fence.guard(generation) as tx:
        outbox.add(tx, key, "email", dict(email))
        files.write("report.txt", report, generation, tx=tx)
    try:  # quicker than waiting for the relay; the key keeps it to one email
        mail.send(email["to"], email["subject"], email["body"], idempotency_key=key)
    except Exception:
        pass
    return True
''', "never calls the email provider itself", "via outbox"),
    "email sent before the fenced commit": ('''
def publish_report(generation, *, fence, files, outbox, mail, report, email):
    mail.send(email["to"], email["subject"], email["body"], idempotency_key=fence.job + "/report-email")
    files.write("report.txt", report, generation)
''', "never calls the email provider itself", ("via outbox", "together", "one email", "current report")),
    "email sent after the commit, directly": ('''
def publish_report(generation, *, fence, files, outbox, mail, report, email):
    files.write("report.txt", report, generation)
    mail.send(email["to"], email["subject"], email["body"], idempotency_key=fence.job + "/report-email")
''', "never calls the email provider itself", ("via outbox", "together", "one email")),
    "the intent recorded outside the file's transaction": ('''
def publish_report(generation, *, fence, files, outbox, mail, report, email):
    files.write("report.txt", report, generation)
    with fence.guard(generation) as tx:
        outbox.add(tx, fence.job + "/report-email", "email", email)
''', "commit together or not at all", "together"),
    "the generation in the intent's key": ('''
def publish_report(generation, *, fence, files, outbox, mail, report, email):
    with fence.guard(generation) as tx:
        files.write("report.txt", report, generation, tx=tx)
        outbox.add(tx, f"{fence.job}/report-email@{generation}", "email", email)
''', "exactly one email", "one email"),
    "skips the step when its email intent is already there": ('''
def publish_report(generation, *, fence, files, outbox, mail, report, email):
    with fence.guard(generation) as tx:
        if outbox.add(tx, f"{fence.job}/report-email", "email", email):
            files.write("report.txt", report, generation, tx=tx)
''', "the committed report is the current owner's", "current report"),
    "sends directly first, with the intent as a fallback": ('''
def publish_report(generation, *, fence, files, outbox, mail, report, email):
    key = f"{fence.job}/report-email"
    try:
        mail.send(email["to"], email["subject"], email["body"], idempotency_key=key)
    except Exception:
        pass  # the outbox will send it
    with fence.guard(generation) as tx:
        files.write("report.txt", report, generation, tx=tx)
        outbox.add(tx, key, "email", email)
''', "never calls the email provider itself", ("via outbox", "one email")),
    "constant": ('''
def publish_report(generation, *, fence, files, outbox, mail, report, email):
    return True
''', "the committed report is the current owner's", None),
}

# --------------------------------------------------------------------- 09.1 incidents
_PICKS = '''
PICKS = {"frozen-export": "fence", "dead-holder": "lease", "double-charge": "idempotency key",
         "late-reply": "conservative deadline", "stuck-release": "owner and generation check",
         "thundering-restart": "backoff with jitter", "forgotten-run": "durable claim and sweeper",
         "stale-email": "outbox", "restored-counter": "new epoch"}

def mechanism(incident):
    return PICKS[incident]
'''

INCIDENT_RIGHT = {
    "an if-chain with capitals and spaces": '''
def mechanism(incident):
    if incident == "frozen-export":
        return "  Fence "
    if incident == "dead-holder":
        return "Lease"
    if incident in ("double-charge",):
        return "Idempotency Key"
    if incident == "late-reply":
        return "conservative deadline"
    if incident == "stuck-release":
        return "owner and generation check"
    if incident == "thundering-restart":
        return "backoff with jitter"
    if incident == "forgotten-run":
        return "durable claim and sweeper"
    if incident == "stale-email":
        return "OUTBOX"
    return "new epoch"
''',
    "a table of (mechanism, incidents)": '''
TABLE = [("fence", ["frozen-export"]), ("lease", ["dead-holder"]), ("idempotency key", ["double-charge"]),
         ("conservative deadline", ["late-reply"]), ("owner and generation check", ["stuck-release"]),
         ("backoff with jitter", ["thundering-restart"]), ("durable claim and sweeper", ["forgotten-run"]),
         ("outbox", ["stale-email"]), ("new epoch", ["restored-counter"])]

def mechanism(incident):
    return next(m for m, names in TABLE if incident in names)
''',
}

INCIDENT_WRONG = {
    "a fence for the double charge": (_PICKS.replace('"double-charge": "idempotency key"',
                                                     '"double-charge": "fence"'), "'double-charge' gets the mechanism", "once"),
    "a longer lease for the frozen export": (_PICKS.replace('"frozen-export": "fence"', '"frozen-export": "lease"'),
                                             "'frozen-export' gets the mechanism", "who may act"),
    "an idempotency key for the stale email": (_PICKS.replace('"stale-email": "outbox"',
                                                              '"stale-email": "idempotency key"'), "'stale-email' gets the mechanism", "once"),
    "a big jump of the counter instead of a new epoch": (_PICKS.replace('"restored-counter": "new epoch"',
                                                               '"restored-counter": "add a large constant"'),
                                                "is one of", "who may act"),
    "a fence for the stuck release (a stale release is like a stale write)": (
        _PICKS.replace('"stuck-release": "owner and generation check"', '"stuck-release": "fence"'),
        "'stuck-release' gets the mechanism", "in time"),
    "constant": ('''
def mechanism(incident):
    return "fence"
''', "'fence' is not it", None),
}

CORPUS = {
    "05.1": {"name": "conservative_deadline", "right": DEADLINE_RIGHT, "wrong": DEADLINE_WRONG},
    "05.2": {"name": "keep_working", "right": HOLDER_RIGHT, "wrong": HOLDER_WRONG},
    "06.1": {"name": "release", "right": RELEASE_RIGHT, "wrong": RELEASE_WRONG},
    "06.2": {"name": "backoff", "right": BACKOFF_RIGHT, "wrong": BACKOFF_WRONG},
    "06.3": {"name": "claim_quiet_lease", "right": VERSION_RIGHT, "wrong": VERSION_WRONG},
    "07.1": {"name": "sweep", "right": SWEEP_RIGHT, "wrong": SWEEP_WRONG},
    "07.2": {"name": "run_job", "right": RESUME_RIGHT, "wrong": RESUME_WRONG},
    "08.1": {"name": "relay", "right": RELAY_RIGHT, "wrong": RELAY_WRONG},
    "08.2": {"name": "publish_report", "right": PUBLISH_RIGHT, "wrong": PUBLISH_WRONG},
    "09.1": {"name": "mechanism", "right": INCIDENT_RIGHT, "wrong": INCIDENT_WRONG},
}
