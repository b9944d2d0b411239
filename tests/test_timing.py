"""Time on the holder's side: conservative deadlines, the lease keeper, backoff, the version-wait claim."""

import math
import random

import pytest
from hypothesis import given, settings, strategies as st

import labkit
from labkit import BadArgument, BadArgumentType, Fence, LeaseAuthority, LeaseLost, StaleGeneration
from labkit.db import execute
from labkit.mechanisms.timing import LeaseKeeper, Seen, VersionLease, backoff, conservative_deadline


class Skewed:
    """A local clock reading ``offset + rate * clock.now()``."""

    def __init__(self, clock, offset=0.0, rate=1.0):
        self.clock, self.offset, self.rate = clock, offset, rate

    def now(self):
        return self.offset + self.rate * self.clock.now()


def test_deadline_formula():
    """The deadline is send_time + ttl * (1 - max_drift) - margin."""
    assert conservative_deadline(100.0, 10.0, 1.0, 0.01) == pytest.approx(108.9)
    assert conservative_deadline(0, 10, 0, 0) == 10.0
    assert conservative_deadline(5, 10, 20, 0) == -5.0      # no protected work at all


@settings(max_examples=300, deadline=None)
@given(send=st.floats(0, 1e6), request=st.floats(0, 60), ttl=st.floats(0.01, 600),
       margin=st.floats(0, 10), drift=st.floats(0, 0.5), offset=st.floats(-1e6, 1e6),
       rate_pick=st.floats(0, 1))
def test_deadline_is_never_after_the_authoritys_expiry(send, request, ttl, margin, drift, offset, rate_pick):
    """For any request latency and any local clock within the drift bound, the deadline falls by the authority's expiry."""
    rate = (1 - drift) + rate_pick * 2 * drift                  # the local clock's speed, within the bound
    local = lambda t: offset + rate * t                          # noqa: E731
    expiry = send + request + ttl                                # the authority starts counting on arrival
    deadline = conservative_deadline(local(send), ttl, margin, drift)
    real_time_of_deadline = (deadline - offset) / rate
    assert real_time_of_deadline <= expiry + 1e-6 * max(1.0, abs(expiry), abs(offset))


def test_counting_from_the_response_overshoots_by_the_round_trip():
    """A holder counting a full ttl from the response's arrival acts request+response seconds past expiry."""
    send, request, response, ttl = 0.0, 2.0, 3.0, 10.0
    expiry = send + request + ttl
    naive = send + request + response + ttl
    assert (naive - expiry, conservative_deadline(send, ttl, 0, 0) <= expiry) == (3.0, True)


@pytest.mark.parametrize("args, argument, error", [
    ((math.nan, 10, 0, 0), "send_time", BadArgument),
    (("0", 10, 0, 0), "send_time", BadArgumentType),
    ((0, 0, 0, 0), "ttl", BadArgument),
    ((0, math.inf, 0, 0), "ttl", BadArgument),
    ((0, 10, -1, 0), "margin", BadArgument),
    ((0, 10, None, 0), "margin", BadArgumentType),
    ((0, 10, 0, 1.0), "max_drift", BadArgument),
    ((0, 10, 0, -0.1), "max_drift", BadArgument),
    ((0, 10, 0, True), "max_drift", BadArgumentType),
])
def test_deadline_validates_every_argument(args, argument, error):
    """Every bad argument raises, naming it."""
    with pytest.raises(error) as caught:
        conservative_deadline(*args)
    assert caught.value.argument == argument


def keeper_on(db, clock, owner="A", local=None, **kw):
    """A LeaseKeeper on a LeaseAuthority reading ``clock``, holder reading ``local`` (default: same clock)."""
    kw = {"ttl": 10, "margin": 1, "max_drift": 0.0, **kw}
    return LeaseKeeper(LeaseAuthority(db, clock), "job", owner, clock=local or clock, **kw)


def test_keeper_acts_until_the_deadline_and_renewal_moves_it(db, clock):
    """Acquire at 0: may act until 9; a renewal sent at 5 moves the deadline to 14."""
    keeper = keeper_on(db, clock)
    lease = keeper.acquire()
    assert (lease.generation, keeper.deadline, keeper.may_act()) == (1, 9.0, True)
    clock.advance(5)
    assert keeper.renew() and keeper.deadline == 14.0
    clock.advance(8.9)
    assert keeper.check().generation == 1
    clock.advance(0.2)
    assert not keeper.may_act()


def test_keeper_uses_the_send_time_not_the_arrival(db, clock):
    """A renewal confirmed late still counts from when it was sent."""
    keeper = keeper_on(db, clock, margin=0)
    keeper.acquire()
    sent = clock.now()
    clock.advance(1)
    renewed = keeper.authority.renew(keeper.lease)        # the authority acts at t=1 ...
    clock.advance(4)                                      # ... the answer arrives at t=5
    assert (renewed.expires_at, keeper.confirm(renewed, sent)) == (11.0, 10.0)


def test_keeper_stops_when_renewal_is_refused(db, clock):
    """After expiry B takes the lease; A's renewal is refused: A drops the lease and check() raises."""
    a = keeper_on(db, clock, "A")
    a.acquire()
    clock.advance(11)
    assert keeper_on(db, clock, "B").acquire().generation == 2
    assert a.renew() is False and a.lease is None
    with pytest.raises(LeaseLost):
        a.check()


def test_keeper_keeps_the_old_deadline_when_renewal_is_uncertain(tmp_path, clock):
    """A renewal that cannot reach the database (locked: Busy) changes nothing: A stops at the old deadline."""
    path = str(tmp_path / "lab.db")
    a = keeper_on(labkit.connect(path, busy_timeout_ms=0), clock)
    a.acquire()
    blocker = labkit.connect(path)
    execute(blocker, "BEGIN IMMEDIATE")
    clock.advance(5)
    assert (a.renew(), a.deadline, a.lease.generation) == (False, 9.0, 1)
    clock.advance(4)
    assert not a.may_act()
    execute(blocker, "ROLLBACK")


def test_keeper_accounts_for_a_slow_local_clock(db, clock):
    """With max_drift 0.1 and a local clock 10% slow, the holder stops before the authority's expiry."""
    slow = Skewed(clock, offset=500.0, rate=0.9)
    keeper = keeper_on(db, clock, local=slow, margin=0, max_drift=0.1)
    lease = keeper.acquire()
    clock.advance(9.99)
    assert keeper.may_act() and clock.now() < lease.expires_at
    clock.advance(0.02)
    assert not keeper.may_act()


@pytest.mark.parametrize("kw, argument", [
    ({"ttl": 0}, "ttl"), ({"margin": -1}, "margin"), ({"max_drift": 2}, "max_drift"),
])
def test_keeper_validates_its_settings(db, clock, kw, argument):
    """Bad keeper settings raise naming the setting."""
    with pytest.raises(BadArgument) as caught:
        keeper_on(db, clock, **kw)
    assert caught.value.argument == argument


def test_backoff_is_full_jitter_within_the_window():
    """Each draw lies in [0, min(cap, base * 2**attempt)] and equals rng.uniform of that window."""
    for attempt in range(12):
        ceiling = min(5.0, 0.1 * 2 ** attempt)
        draws = [backoff(attempt, base=0.1, cap=5.0, rng=random.Random(s)) for s in range(50)]
        assert all(0 <= d <= ceiling for d in draws)
        assert draws[0] == random.Random(0).uniform(0, ceiling)
        assert max(draws) > 0.5 * ceiling      # spread over the window, not bunched at 0


def test_backoff_is_deterministic_for_a_seed_and_survives_huge_attempts():
    """Same seed, same delays; attempt 5000 is capped instead of overflowing."""
    a = [backoff(n, base=0.05, cap=2.0, rng=r) for r in [random.Random(7)] for n in range(20)]
    b = [backoff(n, base=0.05, cap=2.0, rng=r) for r in [random.Random(7)] for n in range(20)]
    assert a == b
    assert 0 <= backoff(5000, base=0.05, cap=2.0, rng=random.Random(1)) <= 2.0


@pytest.mark.parametrize("kw, argument", [
    ({"attempt": -1}, "attempt"), ({"attempt": 1.0}, "attempt"), ({"attempt": True}, "attempt"),
    ({"base": 0}, "base"), ({"cap": -1}, "cap"), ({"cap": math.nan}, "cap"), ({"rng": None}, "rng"),
])
def test_backoff_validates_arguments(kw, argument):
    """Bad backoff arguments raise naming the argument."""
    args = {"attempt": 1, "base": 0.1, "cap": 1.0, "rng": random.Random(0), **kw}
    attempt = args.pop("attempt")
    with pytest.raises((BadArgument, BadArgumentType)) as caught:
        backoff(attempt, **args)
    assert caught.value.argument == argument


def test_version_wait_claims_only_after_an_unchanged_full_duration(db, clock):
    """B waits the record's 10 s on its own clock; a heartbeat during the wait defeats its claim."""
    a_leases, b_leases = VersionLease(db, clock), VersionLease(db, Skewed(clock, offset=1e6))
    a = a_leases.claim(a_leases.observe("job"), "A", duration=10)
    seen = b_leases.observe("job")
    clock.advance(5)
    with pytest.raises(BadArgument):
        b_leases.claim(seen, "B", duration=10)             # too early: refused, nothing written
    a = a_leases.heartbeat(a)                              # A is alive: version moves
    clock.advance(5)
    assert b_leases.claim(seen, "B", duration=10) is None  # waited, but the version changed
    seen = b_leases.observe("job")
    clock.advance(10)
    b = b_leases.claim(seen, "B", duration=10)
    assert (b.owner, b.generation, b.version) == ("B", 2, 3)
    assert (a_leases.heartbeat(a), a_leases.release(a)) == (None, False)
    assert execute(db, "SELECT name, owner, generation, version, duration FROM version_leases") == \
        [("job", "B", 2, 3, 10.0)]


def test_version_wait_compares_no_absolute_clock_readings(db, clock):
    """Two contenders whose clocks differ by days behave alike: only local elapsed time counts."""
    outcomes = []
    for offset in (0.0, 86400.0 * 3):
        leases = VersionLease(db, Skewed(clock, offset=offset))
        seen = leases.observe("job")
        outcomes.append(leases.ready(seen))
    assert outcomes == [True, True]                 # free record: no wait needed for either
    leases = VersionLease(db, clock)
    leases.claim(leases.observe("job"), "A", duration=10)
    waits = [VersionLease(db, Skewed(clock, offset=o)) for o in (0.0, -5e5)]
    seen = [w.observe("job") for w in waits]
    clock.advance(9.5)
    assert [w.ready(s) for w, s in zip(waits, seen)] == [False, False]
    clock.advance(0.5)
    assert [w.ready(s) for w, s in zip(waits, seen)] == [True, True]


def test_version_wait_still_needs_the_fence_for_a_paused_holder(db, clock):
    """A pauses past its duration, B claims; A's write then lands unfenced but is rejected through the fence."""
    leases = VersionLease(db, clock)
    a = leases.claim(leases.observe("job"), "A", duration=10)
    seen = leases.observe("job")
    clock.advance(10)                                  # A is paused: no heartbeat
    b = leases.claim(seen, "B", duration=10)
    fence = Fence(db, "job")
    with fence.guard(b.generation) as tx:
        tx.execute("INSERT INTO invoices VALUES ('job', 'INV-1', 200, ?)", (b.generation,))
    execute(db, "UPDATE invoices SET amount = 100, generation = ? WHERE invoice_id = 'INV-1'", (a.generation,))
    assert execute(db, "SELECT amount, generation FROM invoices") == [(100, 1)]     # unfenced: B's work lost
    with pytest.raises(StaleGeneration):
        with fence.guard(a.generation) as tx:
            tx.execute("UPDATE invoices SET amount = 100, generation = ?", (a.generation,))
    assert (fence.current(), a.generation, b.generation) == (2, 1, 2)


def test_version_lease_release_frees_the_record_for_an_immediate_claim(db, clock):
    """After the holder releases, the next contender claims at once (no wait for a free record)."""
    leases = VersionLease(db, clock)
    a = leases.claim(leases.observe("job"), "A", duration=10)
    assert leases.release(a) is True
    seen = leases.observe("job")
    assert (seen.owner, leases.ready(seen)) == (None, True)
    assert leases.claim(seen, "B", duration=10).generation == 2


def test_version_lease_validates_arguments(db, clock):
    """Bad claims are refused by name and write nothing."""
    leases = VersionLease(db, clock)
    seen = leases.observe("job")
    with pytest.raises(BadArgument) as caught:
        leases.claim(seen, "A", duration=0)
    assert caught.value.argument == "duration"
    with pytest.raises(BadArgumentType) as caught:
        leases.claim(("job", 0), "A", duration=1)
    assert caught.value.argument == "seen"
    with pytest.raises(BadArgumentType):
        leases.heartbeat(seen)                            # a free record is nobody's to renew
    assert leases.observe("job") == Seen("job", None, 0, 0, 0.0, clock.now())
