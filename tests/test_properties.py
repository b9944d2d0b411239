"""Properties over random schedules of acquire/renew/release/guard/advance on a VirtualClock.

Each example runs one random sequence against a fresh database and a simple
model of what the authority and the fence must answer; every step is checked
against the model, and the named property is asserted over the whole run.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import labkit
from labkit import Fence, LeaseAuthority, LeaseHeld, LeaseLost, StaleGeneration
from labkit.db import execute

NAMES, OWNERS = ("n1", "n2"), ("A", "B", "C")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

token = st.one_of(st.integers(0, 12), st.tuples(st.integers(0, 2), st.integers(0, 12)))
step = st.one_of(
    st.tuples(st.just("acquire"), st.sampled_from(NAMES), st.sampled_from(OWNERS),
              st.integers(1, 12), st.booleans()),
    st.tuples(st.just("renew"), st.integers(0, 50), st.sampled_from((None,) + OWNERS)),
    st.tuples(st.just("release"), st.integers(0, 50), st.sampled_from((None,) + OWNERS)),
    st.tuples(st.just("guard"), token, st.booleans()),
    st.tuples(st.just("guard_issued"), st.integers(0, 50)),
    st.tuples(st.just("bypass"), st.integers(0, 12)),
    st.tuples(st.just("advance"), st.sampled_from([0, 0.5, 1, 3, 5, 10, 12])),
)
schedules = st.lists(step, min_size=1, max_size=40)


@dataclasses.dataclass
class Run:
    """What one schedule did: every lease answer, every fence answer, the final tables."""

    issued: dict            # name -> generations handed out, in order
    foreign: list           # (leases table before, after) around every refused renew/release
    accepted: list          # tokens the fence accepted, in order, as (epoch, n)
    rejected: list          # (tables before, after) around every refused write
    writes: list            # the writes table at the end


def pair(t):
    return t if isinstance(t, tuple) else (0, t)


def tables(db):
    return (execute(db, "SELECT * FROM job_fence ORDER BY job_id"),
            execute(db, "SELECT * FROM writes ORDER BY seq"),
            execute(db, "SELECT * FROM invoices ORDER BY invoice_id"))


def run(schedule) -> Run:
    """Play ``schedule``, checking each answer against the model as it goes."""
    clock = labkit.VirtualClock()
    db = labkit.connect()
    execute(db, "CREATE TABLE writes (seq INTEGER PRIMARY KEY, epoch INTEGER, generation INTEGER)")
    leases, fence = LeaseAuthority(db, clock), Fence(db, "job")
    fence.protect("invoices")
    held = {}                      # model: name -> Lease
    counter = {n: 0 for n in NAMES}
    granted, fence_at = [], (0, 0)
    out = Run({n: [] for n in NAMES}, [], [], [], [])
    for n, (kind, *args) in enumerate(schedule):
        if kind == "acquire":
            name, owner, ttl, raising = args
            free = name not in held or clock.now() >= held[name].expires_at
            try:
                got = (leases.acquire if raising else leases.try_acquire)(name, owner, ttl)
            except LeaseHeld:
                got = "held"
            if free:
                counter[name] += 1
                expected = labkit.Lease(name, owner, counter[name], clock.now() + ttl, float(ttl))
                held[name] = expected
                granted.append(expected)
                out.issued[name].append(got.generation)
            else:
                expected = "held" if raising else None
            assert got == expected
        elif kind in ("renew", "release") and granted:
            lease = granted[args[0] % len(granted)]
            if args[1] is not None:                              # someone else's hands
                lease = dataclasses.replace(lease, owner=args[1])
            live = held.get(lease.name)
            matches = live is not None and (live.owner, live.generation) == (lease.owner, lease.generation)
            ok = matches and (kind == "release" or clock.now() < live.expires_at)
            before = execute(db, "SELECT * FROM leases ORDER BY name")
            try:
                answer = getattr(leases, kind)(lease)
            except LeaseLost:
                answer = "lost"
                out.foreign.append((before, execute(db, "SELECT * FROM leases ORDER BY name")))
            if not ok:
                assert answer == "lost"
            elif kind == "renew":
                held[lease.name] = dataclasses.replace(live, expires_at=clock.now() + live.ttl)
                assert answer == held[lease.name]
            else:
                del held[lease.name]
                assert answer is None
        elif kind in ("guard", "guard_issued", "bypass"):
            if kind == "guard_issued":
                if not granted:
                    continue
                offered, crash = granted[args[0] % len(granted)].generation, False
            elif kind == "guard":
                offered, crash = args
            else:
                offered, crash = args[0], False
            expected = "stale" if pair(offered) < fence_at else ("crashed" if crash else "ok")
            before = tables(db)
            try:
                if kind == "bypass":                             # a writer who never calls guard
                    execute(db, "INSERT INTO invoices VALUES ('job', ?, 1, ?)", (f"I{n}", offered))
                else:
                    with fence.guard(offered) as tx:
                        tx.execute("INSERT INTO writes(seq, epoch, generation) VALUES (?, ?, ?)",
                                   (n, *pair(offered)))
                        if crash:
                            raise RuntimeError("crash inside the guard")
                outcome = "ok"
            except StaleGeneration:
                outcome = "stale"
            except RuntimeError:
                outcome = "crashed"
            if outcome == "ok":
                out.accepted.append(pair(offered))
                fence_at = max(fence_at, pair(offered))
            else:
                out.rejected.append((before, tables(db)))
            assert outcome == expected
            assert pair(fence.current()) == fence_at
        elif kind == "advance":
            clock.advance(args[0])
    out.writes = execute(db, "SELECT epoch, generation FROM writes ORDER BY seq")
    db.conn.close()
    return out


@SETTINGS
@given(schedules)
def test_generations_strictly_increase_per_name(schedule):
    """Every acquire of a name gets a generation above every one issued before for that name."""
    issued = run(schedule).issued
    for generations in issued.values():
        assert all(a < b for a, b in zip(generations, generations[1:]))
        assert generations == list(range(1, len(generations) + 1))


@SETTINGS
@given(schedules)
def test_a_refused_renew_or_release_never_changes_a_lease(schedule):
    """A renew or release by a non-owner (or a stale generation) raises LeaseLost and leaves the lease table as it was."""
    for before, after in run(schedule).foreign:
        assert before == after


@SETTINGS
@given(schedules)
def test_the_fence_never_accepts_lower_after_higher(schedule):
    """The tokens the fence accepted, and the rows written under it, never go down."""
    result = run(schedule)
    for seq in (result.accepted, [tuple(w) for w in result.writes]):
        assert all(a <= b for a, b in zip(seq, seq[1:]))


@SETTINGS
@given(schedules)
def test_every_rejected_guard_left_no_rows(schedule):
    """A stale or crashed guard, or a stale bypassing insert, leaves the fence and every table unchanged."""
    for before, after in run(schedule).rejected:
        assert before == after
