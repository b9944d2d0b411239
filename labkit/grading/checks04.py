"""Grading checks of exercise 04 (registered in :mod:`labkit.grading`).

* 04.1 the issuer that never goes backward, across failovers and restored backups.
* 04.2, the cleanup that keeps every generation, is checked in :mod:`labkit.grading.checks04b`.
"""

from __future__ import annotations

from random import Random
import shutil

from labkit.grading.lab import held_open, scratch
from labkit.db import execute
from labkit.grading import Schedule, expect, expect_all, hostile, task
from labkit.sim.history import Event


# ---------------------------------------------------------------- 04.1: an issuer that never goes backward


def _issue_knobs(rng: Random) -> dict:
    ops = []
    for _ in range(rng.randint(2, 5)):
        ops += ["issue"] * rng.randint(1, 4)
        ops.append(rng.choice(["failover", "failover", "restore", "elsewhere"]))
    return {"ops": " ".join(ops + ["issue", "issue"])}


ISSUE_HOSTILE = hostile(
    "ops",
    (
        "a failover loses the last 3 tokens in flight",
        "issue issue issue issue issue failover:3 issue issue issue",
    ),
    (
        "last night's backup is restored after a million more tokens were issued",
        "issue issue elsewhere issue restore:1 issue issue",
    ),
    (
        "two recoveries: the second restores a backup from before the first",
        "issue issue issue failover:2 issue issue restore:1 issue issue",
    ),
    ("a failover that lost nothing (no lag)", "issue issue failover:0 issue"),
    ("no recovery at all: the durable authority is not needed", "issue issue issue issue issue"),
)
_COUNTER = (
    "CREATE TABLE IF NOT EXISTS epoch_counter (name TEXT PRIMARY KEY, "
    "epoch INTEGER NOT NULL, counter INTEGER NOT NULL)"
)


ISSUE_PROPS = {
    "above": "every token is above every token issued before it, across failovers and "
    "restored backups",
    "steps": "each token moves the store's row on by one: counter plus one, or counter 1 in "
    "a new epoch after a recovery",
    "committed": "each token is committed in the store's row before it is handed out",
    "once": "the authority is asked for a new epoch only on recovery, not for every token",
}

ISSUE_RULES = {  # what the issuer must do, in the words of its findings
    "above": "every token is above every token issued before it, across failovers and restored "
    "backups (compared as (epoch, counter))",
    "steps": "each token adds one to the row's counter; a recovery's new epoch starts the counter "
    "again (its first token has counter 1)",
    "committed": "the token is committed in the store's epoch_counter row before it is handed out",
    "once": "the durable authority is asked for a new epoch once per recovery, not for every token",
}


@task(
    "04.1",
    "the issuer that never goes backward",
    ISSUE_HOSTILE,
    count=12,
    make=_issue_knobs,
    returns=(tuple, list, int),
    properties=ISSUE_PROPS,
)
def issuer_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 04.1: ``answer(store, authority, name, recovered) -> (epoch, counter)``.

    A property holds only on calls where the answer moved the name's row and returned it."""
    from labkit.fence import token
    from labkit.mechanisms.issuers import EpochAuthority

    rng = schedule.rng
    with scratch() as tmp:
        name = f"invoice-run-{rng.randrange(1000)}"
        authority = EpochAuthority(tmp.open("authority.db"))
        for _ in range(rng.randint(1, 4)):
            epoch = authority.next_epoch(name)
        store, snapshots = tmp.open("store-0.db"), []
        execute(store, _COUNTER)
        row = (name, epoch, rng.randrange(10**6))
        execute(store, "INSERT INTO epoch_counter VALUES (?, ?, ?)", row)
        highest, recovered, recoveries, t = token(_row(store, name)), False, 0, 0.0
        for op in schedule.knobs["ops"].split():
            what, _, arg = op.partition(":")
            t += 1.0
            if what == "issue":
                before = _row(store, name)
                out = answer(store, authority, name, recovered)
                try:
                    got = token(out, "token")
                except Exception:
                    got = None
                after, open_tx = _row(store, name), store.conn.in_transaction
                outcome = "ok" if got else "rejected"
                history.append(Event(t, "issuer", "write", outcome, got, target=str(got or out)))
                if got is None:
                    rule = "the issuer returns a token (epoch, counter)"
                    expect(False, rule, f"it returned {out!r}", prop="committed")
                history.append(Event(t, "issuer", "raise", "ok", got, target="token"))
                history += [held_open("issuer", t - 0.5)] if open_tx else []
                used = authority.current(name) - epoch
                step = after == (before[0], before[1] + 1) or after[0] > before[0] and after[1] == 1
                holds = {
                    "above": got > highest,
                    "steps": step,
                    "committed": after == got and not open_tx,
                    "once": used <= recoveries,
                }
                recovery = " (just after a recovery)" if recovered else ""
                still_open = ", its transaction still open" if open_tx else ""
                details = {
                    "above": f"it issued {got} after {highest} had been issued{recovery}",
                    "steps": f"the row went from {before} to {after}",
                    "committed": f"it returned {got}; the row holds {after}{still_open}",
                    "once": f"{used} new epochs for {recoveries} recoveries so far",
                }
                checks = [(holds[p], ISSUE_RULES[p], details[p], p) for p in ISSUE_RULES]
                expect_all(checks, acted=got == after != before)  # it issued the row it moved
                highest, recovered = got, False
                snapshots.append(tmp.path(f"snap-{len(snapshots)}.db"))
                execute(store, "VACUUM INTO ?", (snapshots[-1],))  # the whole store, as it is now
            elif what == "elsewhere":  # other holders drew many numbers from the same store
                bump = (rng.choice([10**6, 10**9, 2**40]), name)
                execute(
                    store, "UPDATE epoch_counter SET counter = counter + ? WHERE name = ?", bump
                )
                highest = max(highest, token(_row(store, name)))
                history.append(Event(t, "others", "write", "ok", highest, target="token"))
            else:  # failover to a lagging replica, or restore an old backup
                if what == "failover":
                    back = int(arg) if arg else rng.randint(0, 3)
                    source = snapshots[max(0, len(snapshots) - 1 - back)]
                else:
                    back = int(arg) if arg else rng.randint(1, len(snapshots))
                    source = snapshots[min(back, len(snapshots)) - 1]
                recoveries += 1
                shutil.copyfile(source, tmp.path(f"store-{recoveries}.db"))
                store, recovered = tmp.open(f"store-{recoveries}.db"), True
                now = token(_row(store, name))
                history.append(Event(t, "operator", what, "ok", now, target="store"))


def _row(store, name: str):
    rows = execute(store, "SELECT epoch, counter FROM epoch_counter WHERE name = ?", (name,))
    return tuple(rows[0]) if rows else (0, 0)
