"""Grading checks of exercise 04 (registered in :mod:`labkit.grading`).

* 04.1 the issuer that never goes backward: tokens are issued from a store
  that fails over to lagging replicas (copies of earlier snapshots) and is
  restored from old backups; every token must be above every earlier one.
* 04.2 the cleanup that keeps every generation: the answer deletes expired
  lease rows (``now >= expires_at``) among leases that expire exactly at now,
  a quarter second after it, or long ago, while a holder renews or acquires
  again on a second connection just before the cleanup's n-th SQL statement
  (:func:`~labkit.grading.lab.between_statements`). Then every name is
  acquired again through :class:`~labkit.LeaseAuthority`: each new generation
  must be above every generation ever issued for it.
"""

from __future__ import annotations

from random import Random
import shutil

from labkit.grading.lab import between_statements, call, scratch, shown
from labkit.db import execute
from labkit.grading import Schedule, expect, schedules, task
from labkit.sim.history import Event


# ---------------------------------------------------------------- 04.1: an issuer that never goes backward


def _issue_knobs(rng: Random) -> dict:
    ops = []
    for _ in range(rng.randint(2, 5)):
        ops += ["issue"] * rng.randint(1, 4) + [
            rng.choice(["failover", "failover", "restore", "elsewhere"])
        ]
    return {"ops": " ".join(ops + ["issue", "issue"])}


ISSUE_HOSTILE = [
    {
        "name": "a failover loses the last 3 tokens in flight",
        "ops": "issue issue issue issue issue failover:3 issue issue issue",
    },
    {
        "name": "last night's backup is restored after a million more tokens were issued",
        "ops": "issue issue elsewhere issue restore:1 issue issue",
    },
    {
        "name": "two recoveries: the second restores a backup from before the first",
        "ops": "issue issue issue failover:2 issue issue restore:1 issue issue",
    },
    {"name": "a failover that lost nothing (no lag)", "ops": "issue issue failover:0 issue"},
    {
        "name": "no recovery at all: the durable authority is not needed",
        "ops": "issue issue issue issue issue",
    },
]


@task(
    "04.1",
    "the issuer that never goes backward",
    schedules(ISSUE_HOSTILE, count=12, make=_issue_knobs),
)
def issuer_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 04.1: ``answer(store, authority, name, recovered) -> (epoch, counter)``."""
    from labkit.fence import token
    from labkit.mechanisms.issuers import EpochAuthority

    rng = schedule.rng
    with scratch() as tmp:
        name = f"invoice-run-{rng.randrange(1000)}"
        authority = EpochAuthority(tmp.open("authority.db"))
        for _ in range(rng.randint(1, 4)):
            epoch = authority.next_epoch(name)
        store, stores, snapshots = tmp.open("store-0.db"), [0], []
        execute(
            store,
            "CREATE TABLE IF NOT EXISTS epoch_counter (name TEXT PRIMARY KEY, "
            "epoch INTEGER NOT NULL, counter INTEGER NOT NULL)",
        )
        execute(
            store, "INSERT INTO epoch_counter VALUES (?, ?, ?)", (name, epoch, rng.randrange(10**6))
        )
        highest, recovered, recoveries, t = token(_row(store, name)), False, 0, 0.0
        for op in schedule.knobs["ops"].split():
            what, _, arg = op.partition(":")
            t += 1.0
            if what == "issue":
                out = call(answer, store, authority, name, recovered)
                expect(
                    out[0] == "returned", "the issuer runs without an unexpected error", shown(out)
                )
                try:
                    got = token(out[1], "token")
                except Exception:
                    expect(
                        False,
                        "the issuer returns a token (epoch, counter)",
                        f"it returned {out[1]!r}",
                    )
                history.append(Event(t, "issuer", "write", "ok", got, target=str(got)))
                history.append(Event(t, "issuer", "raise", "ok", got, target="token"))
                expect(
                    got > highest,
                    "every token is above every token issued before it, across failovers "
                    "and restored backups (compared as (epoch, counter))",
                    f"it issued {got} after {highest} had been issued"
                    + (" (just after a recovery)" if recovered else ""),
                )
                expect(
                    token(_row(store, name)) == got,
                    "the token is committed in the store's epoch_counter row "
                    "before it is handed out",
                    f"it returned {got}; the row holds {_row(store, name)}",
                )
                highest, recovered = got, False
                snapshots.append(tmp.path(f"snap-{len(snapshots)}.db"))
                execute(store, "VACUUM INTO ?", (snapshots[-1],))  # the whole store, as it is now
            elif what == "elsewhere":  # other holders drew many numbers from the same store
                bump = rng.choice([10**6, 10**9, 2**40])
                execute(
                    store,
                    "UPDATE epoch_counter SET counter = counter + ? WHERE name = ?",
                    (bump, name),
                )
                highest = max(highest, token(_row(store, name)))
                history.append(Event(t, "others", "write", "ok", highest, target="token"))
            else:  # failover to a lagging replica, or restore an old backup
                back = (
                    int(arg)
                    if arg
                    else rng.randint(0, 3)
                    if what == "failover"
                    else rng.randint(1, len(snapshots))
                )
                source = (
                    snapshots[max(0, len(snapshots) - 1 - back)]
                    if what == "failover"
                    else snapshots[min(back, len(snapshots)) - 1]
                )
                stores.append(len(stores))
                shutil.copyfile(source, tmp.path(f"store-{stores[-1]}.db"))
                store, recovered, recoveries = (
                    tmp.open(f"store-{stores[-1]}.db"),
                    True,
                    recoveries + 1,
                )
                history.append(
                    Event(t, "operator", what, "ok", token(_row(store, name)), target="store")
                )
        used = authority.current(name) - epoch
        expect(
            used <= recoveries,
            "the durable authority is asked for a new epoch once per recovery, not for every token",
            f"{used} new epochs for {recoveries} recoveries",
        )


def _row(store, name: str):
    rows = execute(store, "SELECT epoch, counter FROM epoch_counter WHERE name = ?", (name,))
    return tuple(rows[0]) if rows else (0, 0)


# ---------------------------------------------------------------- 04.2: a cleanup that keeps every generation

_EXPIRY = {
    "expired": lambda rng, now: now - rng.choice([1, 5, 30, 90]),  # expired a while ago
    "boundary": lambda rng, now: now,  # expires exactly at now
    "late": lambda rng, now: now - 0.25,  # expired, live 0.5 s earlier
    "edge": lambda rng, now: now + 0.25,  # a quarter second to go
    "live": lambda rng, now: now + rng.choice([1, 5, 30, 60]),
}
_TOLD = {
    "expired": "expired a while ago",
    "boundary": "expires exactly at now",
    "late": "expired a quarter second ago",
    "edge": "expires a quarter second after now",
    "live": "unexpired",
    "released": "released",
}


_TARGETS = {"renew": ("late",), "reacquire": ("expired", "boundary", "late")}  # whose holder acts


def _cleanup_knobs(rng: Random) -> dict:
    kinds = [
        rng.choice(["expired", "boundary", "late", "edge", "live", "released"])
        for _ in range(rng.randint(2, 6))
    ]
    race = rng.choice([None, "renew", "renew", "reacquire", "reacquire"])
    if race and not set(_TARGETS[race]) & set(kinds):
        kinds.append("late")
    return {
        "kinds": " ".join(kinds),
        "race": race,
        "at": rng.randint(1, 5),
        "earlier": rng.randint(2, 6),
    }


CLEANUP_HOSTILE = [
    {
        "name": "the lesson's story: eight holders came and went, the last lease expired",
        "kinds": "expired live",
        "earlier": 7,
        "race": None,
        "at": 0,
    },
    {
        "name": "a lease expires exactly at now; another a quarter second after",
        "kinds": "boundary edge expired",
        "earlier": 3,
        "race": None,
        "at": 0,
    },
    {
        "name": "nothing has expired: only unexpired leases of several names",
        "kinds": "live edge live",
        "earlier": 2,
        "race": None,
        "at": 0,
    },
    {
        "name": "released leases (counters without a lease row) next to an expired one",
        "kinds": "released expired released",
        "earlier": 4,
        "race": None,
        "at": 0,
    },
    *(
        {
            "name": f"the holder renews (the authority's clock reads 0.5 s behind) just before the cleanup's "
            f"statement {n}",
            "kinds": "late live expired",
            "earlier": 2,
            "race": "renew",
            "at": n,
        }
        for n in (1, 2, 3, 4)
    ),
    *(
        {
            "name": f"the expired holder acquires again just before the cleanup's statement {n}",
            "kinds": "boundary live expired",
            "earlier": 3,
            "race": "reacquire",
            "at": n,
        }
        for n in (1, 2, 3)
    ),
]


def _lease_rows(db) -> set:
    return set(execute(db, "SELECT name, owner, generation, expires_at, ttl FROM leases"))


@task(
    "04.2",
    "the cleanup that keeps every generation",
    schedules(CLEANUP_HOSTILE, count=12, make=_cleanup_knobs),
)
def cleanup_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 04.2: ``answer(conn, now) -> number of lease rows deleted``."""
    from labkit.clock import VirtualClock
    from labkit.errors import Busy, LeaseLost
    from labkit.lease import LeaseAuthority

    rng, k = schedule.rng, schedule.knobs
    kinds = k["kinds"].split()
    start = rng.randrange(40) + rng.choice([0.0, 0.25, 0.5])
    now = start + 130.0  # whole and quarter seconds: every sum below is exact
    with scratch() as tmp:
        db, other = tmp.open(), tmp.open()
        clock = VirtualClock(start)
        authority = LeaseAuthority(other, clock)
        names = [f"{kind}-{rng.randrange(10**4)}-{i}" for i, kind in enumerate(kinds)]
        highest, leases = {}, {}
        for name, kind in zip(names, kinds):  # earlier holders: generations nobody can guess
            for _ in range(k["earlier"] + (kind == "released")):
                lease = authority.acquire(name, "earlier", 10.0)
                authority.release(lease)
                highest[name] = lease.generation
        plans = []  # (acquired at, ttl, name): every lease began before now
        for name, kind in zip(names, kinds):
            if kind != "released":
                expiry = _EXPIRY[kind](rng, now)
                ttl = max(0.0, expiry - now) + rng.choice([2.0, 5.0, 10.0, 20.0, 40.0])
                plans.append((expiry - ttl, ttl, name))
        for owner, (at, ttl, name) in zip("ABCDEFGH", sorted(plans)):
            clock.advance(at - clock.now())
            leases[name] = lease = authority.acquire(name, owner, ttl)
            highest[name] = lease.generation
            history.append(
                Event(
                    at,
                    owner,
                    "acquire",
                    "ok",
                    lease.generation,
                    target=name,
                    until=lease.expires_at,
                )
            )
        target = next(
            (leases[n] for n, kind in zip(names, kinds) if kind in _TARGETS.get(k["race"], ())),
            None,
        )
        before, seen = _lease_rows(other), {}

        def holder(when: float) -> bool:
            """The target's holder renews (authority 0.5 s behind) or acquires again (at now); drawn at ``when``."""
            pre = _lease_rows(other)
            try:
                if k["race"] == "renew":
                    new = LeaseAuthority(other, VirtualClock(now - 0.5)).renew(target)
                else:
                    new = LeaseAuthority(other, VirtualClock(now)).acquire(
                        target.name, target.owner, target.ttl
                    )
                    highest[new.name] = new.generation
            except Busy:
                return False  # the cleanup holds the write lock: after it, then
            except LeaseLost:
                new = None
            seen.update(pre=pre, post=_lease_rows(other), new=new)
            history.append(
                Event(
                    when,
                    target.owner,
                    "renew" if k["race"] == "renew" else "acquire",
                    "ok" if new else "lost",
                    (new or target).generation,
                    target=target.name,
                    until=new and new.expires_at,
                )
            )
            return True

        with between_statements(db, k["at"] if target else 0, lambda: holder(now)) as race:
            out = call(answer, db, now)
        expect(out[0] == "returned", "the cleanup runs without an unexpected error", shown(out))
        expect(
            not db.conn.in_transaction,
            "the cleanup ends its transaction with COMMIT or ROLLBACK",
            "it returned with its transaction still open: it still holds the write lock",
        )
        after, mid = _lease_rows(other), race["done"]
        basis = seen["post"] if mid else before
        early, late = (before - seen["pre"]) if mid else set(), basis - after
        for name, owner, generation, _, _ in sorted(early | late):
            history.append(Event(now, owner, "release", "ok", generation, target=name))
        history.append(Event(now, "cleanup", "cleanup", "ok", target=f"now={now:g}"))
        moment = f"just before the cleanup's SQL statement {k['at']}"
        expect(
            after <= basis,
            "the cleanup only deletes lease rows; it never adds or changes one",
            f"rows that appeared or changed: {sorted(after - basis)}",
        )
        expect(
            not (early and late),
            "all of the cleanup's deletions commit together, in one transaction",
            f"{moment}, another connection already saw {sorted(r[0] for r in early)} deleted; "
            f"{sorted(r[0] for r in late)} went later",
        )
        alive = sorted(r for r in early | late if r[3] > now)
        expect(
            not alive,
            "the cleanup never deletes a lease that is unexpired at now (expires_at > now), not "
            "even one renewed or acquired again while the cleanup runs",
            "; ".join(
                f"it deleted {o}'s lease on {n} (generation {g}, expires at t={e:g}; now is t={now:g})"
                + (
                    f", which {o} had renewed or acquired again {moment}"
                    if mid and r not in before
                    else ""
                )
                for r in alive
                for n, o, g, e, _ in [r]
            ),
        )
        kept = sorted(r for r in basis & after if r[3] <= now)
        expect(
            not kept,
            "the cleanup deletes every lease that has expired at now (expired means now >= expires_at)",
            "; ".join(
                f"{o}'s lease on {n} expires at t={e:g}, "
                + ("exactly at now" if e == now else f"{now - e:g} s before now")
                + ", and it is still there"
                for n, o, _, e, _ in kept
            ),
        )
        got = out[1]
        expect(
            isinstance(got, int) and not isinstance(got, bool) and got == len(early | late),
            "the cleanup returns how many lease rows it deleted",
            f"it returned {got!r} and deleted {len(early | late)}",
        )
        if target and not mid:
            holder(now + 0.25)  # the holder comes after the cleanup
        final = {r[0]: r for r in _lease_rows(other)}
        for at, name in sorted(
            (max(now, final[n][3]) if n in final else now, n) for n in names
        ):  # newcomers
            lease = LeaseAuthority(other, VirtualClock(at)).try_acquire(name, "I", 10.0)
            expect(
                lease is not None,
                "a name is free again once its lease has expired",
                f"{name} at t={at:g}",
            )
            history.append(
                Event(
                    at + 0.25,
                    "I",
                    "acquire",
                    "ok",
                    lease.generation,
                    target=name,
                    until=lease.expires_at,
                )
            )
            expect(
                lease.generation > highest[name],
                "after the cleanup, the next holder gets a generation above "
                "every generation ever issued for the name (the permanent counter survives the cleanup)",
                f"I acquired {name} ({_TOLD[kinds[names.index(name)]]}) and got generation {lease.generation}; "
                f"{highest[name]} had been issued",
            )
