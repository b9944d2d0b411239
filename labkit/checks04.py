"""Grading checks of exercise 04 (registered in :mod:`labkit.grading`).

* 04.1 the issuer that never goes backward: tokens are issued from a store
  that fails over to lagging replicas (copies of earlier snapshots) and is
  restored from old backups; every token must be above every earlier one.
"""

from __future__ import annotations

import random
import shutil

from .checks_lab import call, scratch, shown
from .db import execute
from .grading import Schedule, expect, schedules, task
from .history import Event


# ---------------------------------------------------------------- 04.1: an issuer that never goes backward

def _issue_knobs(rng: random.Random) -> dict:
    ops = []
    for _ in range(rng.randint(2, 5)):
        ops += ["issue"] * rng.randint(1, 4) + [rng.choice(["failover", "failover", "restore", "elsewhere"])]
    return {"ops": " ".join(ops + ["issue", "issue"])}


ISSUE_HOSTILE = [
    {"name": "a failover loses the last 3 tokens in flight", "ops": "issue issue issue issue issue failover:3 "
                                                                    "issue issue issue"},
    {"name": "last night's backup is restored after a million more tokens were issued",
     "ops": "issue issue elsewhere issue restore:1 issue issue"},
    {"name": "two recoveries: the second restores a backup from before the first",
     "ops": "issue issue issue failover:2 issue issue restore:1 issue issue"},
    {"name": "a failover that lost nothing (no lag)", "ops": "issue issue failover:0 issue"},
    {"name": "no recovery at all: the durable authority is not needed", "ops": "issue issue issue issue issue"},
]


@task("04.1", "the issuer that never goes backward", schedules(ISSUE_HOSTILE, count=12, make=_issue_knobs))
def issuer_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 04.1: ``answer(store, authority, name, recovered) -> (epoch, counter)``."""
    from .fence import token
    from .issuers import EpochAuthority
    rng = schedule.rng
    with scratch() as tmp:
        name = f"invoice-run-{rng.randrange(1000)}"
        authority = EpochAuthority(tmp.open("authority.db"))
        for _ in range(rng.randint(1, 4)):
            epoch = authority.next_epoch(name)
        store, stores, snapshots = tmp.open("store-0.db"), [0], []
        execute(store, "CREATE TABLE IF NOT EXISTS epoch_counter (name TEXT PRIMARY KEY, "
                       "epoch INTEGER NOT NULL, counter INTEGER NOT NULL)")
        execute(store, "INSERT INTO epoch_counter VALUES (?, ?, ?)", (name, epoch, rng.randrange(10 ** 6)))
        highest, recovered, recoveries, t = token(_row(store, name)), False, 0, 0.0
        for op in schedule.knobs["ops"].split():
            what, _, arg = op.partition(":")
            t += 1.0
            if what == "issue":
                out = call(answer, store, authority, name, recovered)
                expect(out[0] == "returned", "the issuer runs without an unexpected error", shown(out))
                try:
                    got = token(out[1], "token")
                except Exception:
                    expect(False, "the issuer returns a token (epoch, counter)", f"it returned {out[1]!r}")
                history.append(Event(t, "issuer", "write", "ok", got, target=str(got)))
                history.append(Event(t, "issuer", "raise", "ok", got, target="token"))
                expect(got > highest, "every token is above every token issued before it, across failovers "
                                      "and restored backups (compared as (epoch, counter))",
                       f"it issued {got} after {highest} had been issued" + (" (just after a recovery)" if recovered else ""))
                expect(token(_row(store, name)) == got, "the token is committed in the store's epoch_counter row "
                       "before it is handed out", f"it returned {got}; the row holds {_row(store, name)}")
                highest, recovered = got, False
                snapshots.append(tmp.path(f"snap-{len(snapshots)}.db"))
                execute(store, "VACUUM INTO ?", (snapshots[-1],))     # the whole store, as it is now
            elif what == "elsewhere":        # other holders drew many numbers from the same store
                bump = rng.choice([10 ** 6, 10 ** 9, 2 ** 40])
                execute(store, "UPDATE epoch_counter SET counter = counter + ? WHERE name = ?", (bump, name))
                highest = max(highest, token(_row(store, name)))
                history.append(Event(t, "others", "write", "ok", highest, target="token"))
            else:                            # failover to a lagging replica, or restore an old backup
                back = int(arg) if arg else rng.randint(0, 3) if what == "failover" else rng.randint(1, len(snapshots))
                source = snapshots[max(0, len(snapshots) - 1 - back)] if what == "failover" else snapshots[min(back, len(snapshots)) - 1]
                stores.append(len(stores))
                shutil.copyfile(source, tmp.path(f"store-{stores[-1]}.db"))
                store, recovered, recoveries = tmp.open(f"store-{stores[-1]}.db"), True, recoveries + 1
                history.append(Event(t, "operator", what, "ok", token(_row(store, name)), target="store"))
        used = authority.current(name) - epoch
        expect(used <= recoveries, "the durable authority is asked for a new epoch once per recovery, not for "
               "every token", f"{used} new epochs for {recoveries} recoveries")


def _row(store, name: str):
    rows = execute(store, "SELECT epoch, counter FROM epoch_counter WHERE name = ?", (name,))
    return tuple(rows[0]) if rows else (0, 0)

