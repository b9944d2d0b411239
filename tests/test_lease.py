"""Leases: who may act until when, and the permanent generation counter behind them."""

import dataclasses

import pytest

import labkit
from labkit import Lease, LeaseHeld, LeaseLost
from labkit.db import execute


def rows(db):
    """The lease table and the counter table, whole."""
    return (execute(db, "SELECT name, owner, generation, expires_at, ttl FROM leases ORDER BY name"),
            execute(db, "SELECT name, generation FROM lease_counter ORDER BY name"))


def test_acquire_grants_generation_one_with_expiry_now_plus_ttl(leases, clock, db):
    """The first acquire of a name gets generation 1, expiring at now + ttl."""
    clock.advance(3)
    lease = leases.acquire("invoice-run", "A", ttl=10)
    assert lease == Lease("invoice-run", "A", 1, 13.0, 10.0)
    assert rows(db) == ([("invoice-run", "A", 1, 13.0, 10.0)], [("invoice-run", 1)])


def test_acquire_raises_lease_held_while_unexpired_even_for_the_holder(leases, clock, db):
    """While A's lease is unexpired, A and B both get LeaseHeld (with the holder's data); nothing changes."""
    leases.acquire("job", "A", ttl=10)
    before = rows(db)
    clock.advance(9.999)
    for who in ("A", "B"):
        with pytest.raises(LeaseHeld) as caught:
            leases.acquire("job", who, ttl=10)
        assert (caught.value.name, caught.value.holder, caught.value.generation,
                caught.value.expires_at) == ("job", "A", 1, 10.0)
        assert "'A'" in str(caught.value) and "job" in str(caught.value)
    assert rows(db) == before


def test_try_acquire_returns_none_while_held_and_changes_nothing(leases, clock, db):
    """try_acquire answers None instead of raising, and spends no generation."""
    leases.acquire("job", "A", ttl=10)
    before = rows(db)
    assert leases.try_acquire("job", "B", ttl=10) is None
    assert leases.try_acquire("job", "A", ttl=10) is None
    assert rows(db) == before


def test_a_lease_is_expired_exactly_at_expires_at(leases, clock):
    """At now == expires_at the lease is gone: current() is None and B acquires generation 2."""
    leases.acquire("job", "A", ttl=10)
    clock.advance(10)
    assert leases.current("job") is None
    assert leases.acquire("job", "B", ttl=5) == Lease("job", "B", 2, 15.0, 5.0)


def test_renew_keeps_generation_and_extends_from_now(leases, clock, db):
    """renew returns the same generation with expires_at = now + ttl, and stores it."""
    a = leases.acquire("job", "A", ttl=10)
    clock.advance(7)
    renewed = leases.renew(a)
    assert renewed == Lease("job", "A", 1, 17.0, 10.0)
    assert leases.current("job") == renewed
    assert rows(db)[0] == [("job", "A", 1, 17.0, 10.0)]


def test_renew_after_expiry_raises_lease_lost_even_if_nobody_took_over(leases, clock, db):
    """An expired lease cannot be renewed, even with no successor; nothing changes."""
    a = leases.acquire("job", "A", ttl=10)
    clock.advance(10)
    before = rows(db)
    with pytest.raises(LeaseLost) as caught:
        leases.renew(a)
    assert (caught.value.name, caught.value.owner, caught.value.generation) == ("job", "A", 1)
    assert rows(db) == before


@pytest.mark.parametrize("forged", [
    {"owner": "B"},              # right generation, wrong owner
    {"generation": 2},           # right owner, wrong generation
    {"owner": "B", "generation": 0},
    {"name": "other"},
])
def test_renew_and_release_need_owner_and_generation_to_match(leases, clock, db, forged):
    """A renew or release whose owner or generation differs raises LeaseLost and changes nothing."""
    a = leases.acquire("job", "A", ttl=10)
    impostor = dataclasses.replace(a, **forged)
    before = rows(db)
    with pytest.raises(LeaseLost):
        leases.renew(impostor)
    with pytest.raises(LeaseLost):
        leases.release(impostor)
    assert rows(db) == before
    assert leases.current("job") == a


def test_a_late_release_from_a_never_deletes_bs_lease(leases, clock, db):
    """A pauses past expiry, B acquires generation 2; A's release raises LeaseLost and B keeps the lease."""
    a = leases.acquire("job", "A", ttl=10)
    clock.advance(12)
    b = leases.acquire("job", "B", ttl=10)
    with pytest.raises(LeaseLost):
        leases.release(a)
    with pytest.raises(LeaseLost):
        leases.renew(a)
    assert leases.current("job") == b == Lease("job", "B", 2, 22.0, 10.0)
    assert rows(db) == ([("job", "B", 2, 22.0, 10.0)], [("job", 2)])


def test_release_deletes_the_lease_and_frees_the_name(leases, clock, db):
    """After release, current() is None, a second release raises LeaseLost, and the next acquire is generation 2."""
    a = leases.acquire("job", "A", ttl=10)
    assert leases.release(a) is None
    assert leases.current("job") is None
    with pytest.raises(LeaseLost):
        leases.release(a)
    assert leases.acquire("job", "A", ttl=10).generation == 2


def test_release_of_an_expired_but_unreplaced_lease_succeeds(leases, clock):
    """The owner may still clean up its own expired lease when nobody replaced it."""
    a = leases.acquire("job", "A", ttl=10)
    clock.advance(30)
    leases.release(a)
    assert execute(leases.db, "SELECT count(*) FROM leases") == [(0,)]


def test_generations_survive_release_expiry_and_deleted_lease_rows(leases, clock, db):
    """Release, expiry and a cleanup that deletes every lease row never reset the counter."""
    issued = [leases.acquire("job", "A", ttl=1).generation]
    leases.release(leases.current("job"))
    issued.append(leases.acquire("job", "B", ttl=1).generation)
    clock.advance(1)                                            # expiry
    issued.append(leases.acquire("job", "C", ttl=1).generation)
    execute(db, "DELETE FROM leases")                           # a cleanup job
    issued.append(leases.acquire("job", "D", ttl=1).generation)
    assert issued == [1, 2, 3, 4]


def test_names_have_independent_counters(leases, clock):
    """Each name counts its own generations."""
    issued = [(n, leases.acquire(n, "A", ttl=5).generation) for n in ("x", "y")]
    clock.advance(5)
    issued += [(n, leases.acquire(n, "B", ttl=5).generation) for n in ("x", "x2", "y")]
    assert issued == [("x", 1), ("y", 1), ("x", 2), ("x2", 1), ("y", 2)]


def test_current_returns_the_unexpired_lease_or_none(leases, clock):
    """current() is None before, the lease during, and None after expiry."""
    assert leases.current("job") is None
    a = leases.acquire("job", "A", ttl=10)
    assert leases.current("job") == a
    clock.advance(10)
    assert leases.current("job") is None


def test_two_authorities_on_one_file_share_leases_and_counter(reopen, clock):
    """Two connections to one database see the same lease and never reuse a generation."""
    first = labkit.LeaseAuthority(reopen(), clock)
    second = labkit.LeaseAuthority(reopen(), clock)
    a = first.acquire("job", "A", ttl=10)
    assert second.current("job") == a
    with pytest.raises(LeaseHeld):
        second.acquire("job", "B", ttl=10)
    clock.advance(10)
    assert second.acquire("job", "B", ttl=10).generation == 2


def test_lease_is_a_frozen_value_that_checks_its_fields():
    """Lease is frozen, compares by value, and refuses a bool generation."""
    lease = Lease("job", "A", 1, 10.0, 10.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lease.generation = 2
    assert lease == Lease("job", "A", 1, 10.0, 10.0)
    with pytest.raises(labkit.BadArgumentType, match="generation"):
        Lease("job", "A", True, 10.0, 10.0)
