"""Leases on a shared server read the server's clock: two machines' clocks never decide alone.

RealClock is a machine's uptime. Two authorities on one PostgreSQL database whose clocks start
at different origins (two laptops) both see the other's lease as expired, and two holders act
at once; with the server's ``clock_timestamp()`` (the default there) there is one at a time.
"""

import pytest

import labkit
from labkit import BadArgument, LeaseAuthority, RealClock, VirtualClock


class Elsewhere(RealClock):
    """Another machine's RealClock: its uptime is an hour longer than ours."""

    def now(self) -> float:
        return super().now() + 3600.0


@pytest.fixture
def two(pg_schema):
    """Two connections to one PostgreSQL database, as from two machines."""
    dbs = [labkit.connect(pg_schema.url), labkit.connect(pg_schema.url)]
    yield dbs
    for db in dbs:
        db.conn.close()


def test_clocks_with_different_origins_give_two_holders_at_once(two):
    """The failure, on the path a RealClock would take: A (uptime 0) holds for 10 s; B (uptime an
    hour) sees the lease long expired and takes it too."""
    a = LeaseAuthority(two[0], VirtualClock(0.0)).acquire("job", "A", ttl=10)
    b = LeaseAuthority(two[1], VirtualClock(3600.0)).try_acquire("job", "B", ttl=10)
    assert a.owner == "A" and b is not None and b.owner == "B"  # two holders, 0 s apart


@pytest.mark.parametrize("clock", [RealClock(), Elsewhere()], ids=["here", "elsewhere"])
def test_a_real_clock_on_a_server_is_refused_with_the_reason(two, clock):
    """RealClock with a PostgreSQL database raises BadArgument naming clock, saying why."""
    with pytest.raises(BadArgument, match="clock.*machine.*server's clock"):
        LeaseAuthority(two[0], clock)


def test_the_servers_clock_gives_one_holder_at_a_time(two):
    """By default both authorities read clock_timestamp(): B is refused while A holds, and wins
    once A has released; the expiry is on the server's clock (seconds since the epoch)."""
    first, second = LeaseAuthority(two[0]), LeaseAuthority(two[1])
    a = first.acquire("job", "A", ttl=30)
    assert second.try_acquire("job", "B", ttl=30) is None
    assert second.current("job") == a
    assert abs(first.clock.now() - second.clock.now()) < 5 and a.expires_at > 1.7e9
    first.release(a)
    assert second.acquire("job", "B", ttl=30).generation == a.generation + 1


def test_sqlite_still_needs_its_clock(db_path):
    """On SQLite nothing is shared: leaving the clock out is a named error."""
    db = labkit.connect(db_path)
    with pytest.raises(labkit.LabkitError, match="clock"):
        LeaseAuthority(db)
    assert LeaseAuthority(db, RealClock()).acquire("job", "A", ttl=1).generation == 1
    db.conn.close()
