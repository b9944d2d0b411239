"""Grading check of exercise 04, task 04.2 (registered in :mod:`labkit.grading`).

* 04.2 the cleanup that keeps every generation, while a holder renews or acquires
  again between the cleanup's statements.
"""

from __future__ import annotations

from random import Random

from labkit.db import execute
from labkit.grading import Schedule, expect_all, hostile, task
from labkit.grading.lab import between_statements, held_open, lease_event, scratch
from labkit.sim.history import Event

_KINDS = {  # kind: (its lease in words, its expiry drawn for now)
    "expired": ("expired a while ago", lambda rng, now: now - rng.choice([1, 5, 30, 90])),
    "boundary": ("expires exactly at now", lambda rng, now: now),
    "late": ("expired a quarter second ago", lambda rng, now: now - 0.25),
    "edge": ("expires a quarter second after now", lambda rng, now: now + 0.25),
    "live": ("unexpired", lambda rng, now: now + rng.choice([1, 5, 30, 60])),
    "released": ("released", None),  # a counter without a lease row
}


# whose holder acts: a renewal needs a live lease (the authority's clock reads now, as the cleanup's)
_TARGETS = {"renew": ("edge", "live"), "reacquire": ("expired", "boundary", "late")}


def _cleanup_knobs(rng: Random) -> dict:
    kinds = [rng.choice(list(_KINDS)) for _ in range(rng.randint(2, 6))]
    race = rng.choice([None, "renew", "renew", "reacquire", "reacquire"])
    if race and not set(_TARGETS[race]) & set(kinds):
        kinds.append(_TARGETS[race][-1])
    at, earlier = rng.randint(1, 5), rng.randint(2, 6)
    return {"kinds": " ".join(kinds), "race": race, "at": at, "earlier": earlier}


_RENEWS = "a holder renews its unexpired lease just before the cleanup's"
CLEANUP_HOSTILE = hostile(
    "kinds earlier race at each",
    ("the lesson's story: eight holders came and went, the last lease expired", "expired live", 7),
    ("a lease expires exactly at now; another a quarter second after", "boundary edge expired", 3),
    ("nothing has expired: only unexpired leases of several names", "live edge live", 2),
    ("released leases (counters without a lease row) next to an expired one",
     "released expired released", 4),
    *((f"{_RENEWS} statement {n}", "edge late expired", 2, "renew", n, "at" if n == 4 else None)
      for n in (1, 2, 3, 4)),
    *((f"the expired holder acquires again just before the cleanup's statement {n}",
       "boundary live expired", 3, "reacquire", n, "at" if n == 3 else None) for n in (1, 2, 3)),
)  # fmt: skip
CLEANUP_PROPS = {
    "expired deleted": "every lease that has expired at now (now >= expires_at) is deleted",
    "live kept": "the cleanup only deletes, and never a lease unexpired at now, not even one "
    "renewed or taken again while it runs",
    "one transaction": "the deletions commit together, in one transaction that the cleanup ends",
    "count": "the cleanup returns how many lease rows it deleted",
    "counter": "lease_counter is left as it is: the next holder of a name gets a generation "
    "above every one ever issued",
}

CLEANUP_RULES = {  # what the cleanup must do, in the words of its findings
    "ends": "the cleanup ends its transaction with COMMIT or ROLLBACK",
    "together": "all of the cleanup's deletions commit together, in one transaction",
    "only deletes": "the cleanup only deletes lease rows; it never adds or changes one",
    "live kept": "the cleanup never deletes a lease that is unexpired at now (expires_at > now), "
    "not even one renewed or acquired again while the cleanup runs",
    "expired deleted": "the cleanup deletes every lease that has expired at now (expired means "
    "now >= expires_at)",
    "count": "the cleanup returns how many lease rows it deleted",
}


def _lease_rows(db) -> set:
    return set(execute(db, "SELECT name, owner, generation, expires_at, ttl FROM leases"))


def _counters(db) -> set:
    return set(execute(db, "SELECT name, generation FROM lease_counter"))


@task(
    "04.2",
    "the cleanup that keeps every generation",
    CLEANUP_HOSTILE,
    count=12,
    make=_cleanup_knobs,
    returns=(int,),
    properties=CLEANUP_PROPS,
)
def cleanup_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 04.2: ``answer(conn, now) -> number of lease rows deleted``; a property
    holds only where the cleanup deleted a lease row (every break counts)."""
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
                expiry = _KINDS[kind][1](rng, now)
                ttl = max(0.0, expiry - now) + rng.choice([2.0, 5.0, 10.0, 20.0, 40.0])
                plans.append((expiry - ttl, ttl, name))
        for owner, (at, ttl, name) in zip("ABCDEFGH", sorted(plans)):
            clock.advance(at - clock.now())
            leases[name] = lease = authority.acquire(name, owner, ttl)
            highest[name] = lease.generation
            lease_event(history, at, lease)
        targets = [
            leases[n] for n, kind in zip(names, kinds) if kind in _TARGETS.get(k.get("race"), ())
        ]
        target = targets[0] if targets else None
        before, seen, counters = _lease_rows(other), {}, _counters(other)

        def holder(when: float) -> bool:
            """The target's holder renews or acquires again at ``when`` on the authority's clock,
            the clock the cleanup's ``now`` is read from: one clock judges expiry."""
            pre, renew = _lease_rows(other), k.get("race") == "renew"
            try:
                if renew:
                    new = LeaseAuthority(other, VirtualClock(when)).renew(target)
                else:
                    again = LeaseAuthority(other, VirtualClock(when))
                    new = again.acquire(target.name, target.owner, target.ttl)
                    highest[new.name] = new.generation
            except Busy:
                return False  # the cleanup holds the write lock: after it, then
            except LeaseLost:
                new = None
            seen.update(pre=pre, post=_lease_rows(other), new=new)
            action = "renew" if renew else "acquire"
            lease_event(history, when, new or target, action, "ok" if new else "lost")
            return True

        with between_statements(db, k.get("at") if target else 0, lambda: holder(now)) as race:
            got = answer(db, now)
        after, mid, open_tx = _lease_rows(other), race["done"], db.conn.in_transaction
        basis = seen["post"] if mid else before
        early, late = (before - seen["pre"]) if mid else set(), basis - after
        had = {r[0] for r in before}  # acted: it deleted a name's lease row (an UPDATE is no act)
        acted = bool(had - {r[0] for r in after} or mid and had - {r[0] for r in seen["pre"]})
        for name, owner, generation, _, _ in sorted(early | late):
            history.append(Event(now, owner, "release", "ok", generation, target=name))
        history.append(Event(now, "cleanup", "cleanup", "ok", target=f"now={now:g}"))
        history += [held_open("cleanup", now - 0.5)] if open_tx else []
        moment = f"just before the cleanup's SQL statement {k.get('at')}"
        alive = sorted(r for r in early | late if r[3] > now)
        renewed = {r for r in alive if mid and r not in before}
        kept = sorted(r for r in basis & after if r[3] <= now)
        moved = sorted(n for n in counters - _counters(other) if not (mid and n[0] == target.name))
        still_open = "it returned with its transaction still open: it still holds the write lock"
        saw = f"{moment}, another connection already saw {sorted(r[0] for r in early)} deleted"
        went = f"{saw}; {sorted(r[0] for r in late)} went later"
        changed = f"rows that appeared or changed: {sorted(after - basis)}"
        deleted = [
            f"it deleted {o}'s lease on {n} (generation {g}, expires at t={e:g}; now is t={now:g})"
            + (f", which {o} had renewed or acquired again {moment}" if r in renewed else "")
            for r in alive
            for n, o, g, e, _ in [r]
        ]
        left = [
            f"{o}'s lease on {n} expires at t={e:g}, "
            + ("exactly at now" if e == now else f"{now - e:g} s before now")
            + ", and it is still there"
            for n, o, _, e, _ in kept
        ]
        count = f"it returned {got!r} and deleted {len(early | late)}"
        checks = [
            (not open_tx, CLEANUP_RULES["ends"], still_open, "one transaction"),
            (not (early and late), CLEANUP_RULES["together"], went, "one transaction"),
            (after <= basis, CLEANUP_RULES["only deletes"], changed, "live kept"),
            (not alive, CLEANUP_RULES["live kept"], "; ".join(deleted), "live kept"),
            (not kept, CLEANUP_RULES["expired deleted"], "; ".join(left), "expired deleted"),
            (type(got) is int and got == len(early | late), CLEANUP_RULES["count"], count, "count"),
        ]
        if open_tx:  # it holds the write lock: nobody else can acquire
            expect_all(checks, acted=acted)
        if target and not mid:
            holder(now + 0.25)  # the holder comes after the cleanup
        final = {r[0]: r for r in _lease_rows(other)}
        free_at = [(max(now, final[n][3]) if n in final else now, n) for n in names]
        for at, name in sorted(free_at):  # newcomers
            lease = LeaseAuthority(other, VirtualClock(at)).try_acquire(name, "I", 10.0)
            if lease is not None:
                lease_event(history, at + 0.25, lease)
            gen = lease and lease.generation
            rule = (
                "after the cleanup, the next holder gets a generation above every generation "
                "ever issued for the name (the permanent counter survives the cleanup)"
            )
            lease_words = _KINDS[kinds[names.index(name)]][0]
            given = f"generation {gen}; {highest[name]} had been issued" if lease else "nothing"
            detail = f"I acquired {name} ({lease_words}) at t={at:g} and got {given}"
            checks.append((lease is not None and gen > highest[name], rule, detail, "counter"))
        detail = f"rows it changed or deleted: {moved}"
        checks.append((not moved, "the cleanup leaves lease_counter as it is", detail, "counter"))
        expect_all(checks, acted=acted)
