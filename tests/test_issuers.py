"""Who issues the numbers: durable counters, replicated ones that fail over, backups, epochs."""

import pytest

from labkit import BadArgument, BadArgumentType, Fence, LeaseAuthority, StaleGeneration
from labkit.db import execute
from labkit.mechanisms.issuers import (EpochAuthority, EpochIssuer, ReplicatedIssuer, backup,
                            bump_is_safe, cleanup_expired, naive_cleanup, restore)


def fenced_write(db, generation):
    """Write INV-1 through the fence; return 'ok' or 'rejected'."""
    counter = generation[1] if isinstance(generation, tuple) else generation
    try:
        with Fence(db, "invoice-run").guard(generation) as tx:
            tx.execute("INSERT INTO invoices VALUES ('invoice-run', 'INV-1', 100, ?) "
                       "ON CONFLICT DO UPDATE SET generation = excluded.generation", (counter,))
        return "ok"
    except StaleGeneration:
        return "rejected"


def test_cleanup_expired_keeps_the_generation(files, clock):
    """The right cleanup deletes the expired lease row only: the next holder still gets a higher number."""
    db = files("authority")
    leases = LeaseAuthority(db, clock)
    for _ in range(8):
        leases.release(leases.acquire("invoice-run", "A", ttl=10))
    leases.acquire("invoice-run", "A", ttl=10)          # generation 9, then it expires
    clock.advance(11)
    assert cleanup_expired(db, clock, "invoice-run") == 1
    assert execute(db, "SELECT count(*) FROM leases") == [(0,)]
    assert leases.acquire("invoice-run", "B", ttl=10).generation == 10


def test_naive_cleanup_restarts_at_one_and_the_fence_rejects_the_new_holder(files, clock):
    """Deleting the counter with the lease makes the next holder generation 1, below a fence that saw 8."""
    db, resource = files("authority"), files("resource")
    leases = LeaseAuthority(db, clock)
    for _ in range(7):
        leases.release(leases.acquire("invoice-run", "old", ttl=10))
    b = leases.acquire("invoice-run", "B", ttl=10)
    assert (b.generation, fenced_write(resource, b.generation)) == (8, "ok")
    clock.advance(11)
    assert naive_cleanup(db, clock, "invoice-run") == 2      # the lease row and the counter row
    c = leases.acquire("invoice-run", "C", ttl=10)
    assert (c.generation, fenced_write(resource, c.generation)) == (1, "rejected")


def test_naive_cleanup_leaves_a_live_lease_and_its_counter_alone(files, clock):
    """A cleanup never deletes an unexpired lease or the counter behind it."""
    db = files("authority")
    leases = LeaseAuthority(db, clock)
    leases.acquire("invoice-run", "A", ttl=10)
    assert naive_cleanup(db, clock, "invoice-run") == 0
    assert execute(db, "SELECT generation FROM lease_counter") == [(1,)]


def test_restoring_a_backup_moves_a_durable_counter_backward(files, clock, tmp_path):
    """A real SQLite backup taken at 6, restored after 7 and 8 were issued: the next number is 7 again."""
    db, other = files("authority"), files("authority")
    counter = EpochIssuer(db, "invoice-run")
    for _ in range(6):
        counter.issue()
    backup(db, str(tmp_path / "nightly.db"))
    assert (counter.issue(), counter.issue()) == (7, 8)
    restore(db, str(tmp_path / "nightly.db"))
    assert EpochIssuer(other, "invoice-run").current() == 6   # every connection sees the restore
    assert counter.issue() == 7


def test_replicated_issuer_without_lag_keeps_order_across_failover(files, clock):
    """With lag 0 every issued number is on the replica before the failover: no number comes back."""
    issuer = ReplicatedIssuer(files("primary"), files("replica"), clock, "invoice-run", lag=0)
    assert [issuer.issue() for _ in range(3)] == [1, 2, 3]
    assert issuer.failover() == 0
    assert issuer.issue() == 4


def test_replicated_issuer_hands_out_a_number_again_when_failover_beats_the_lag(files, clock):
    """Numbers younger than the lag are lost at failover and issued again by the promoted replica."""
    issuer = ReplicatedIssuer(files("primary"), files("replica"), clock, "invoice-run", lag=5)
    assert issuer.issue() == 1                     # committed at t=0
    clock.advance(3)
    assert issuer.issue() == 2                     # committed at t=3
    clock.advance(3)                               # t=6: entry 1 is due, entry 2 is not
    assert issuer.replicate() == 1
    assert issuer.failover() == 1                  # entry 2 was in flight
    assert (issuer.current(), issuer.issue()) == (1, 2)
    with pytest.raises(BadArgument) as caught:
        issuer.failover()
    assert caught.value.argument == "replica"


def test_epoch_after_failover_orders_new_tokens_above_every_old_one(files, clock):
    """After failover a new epoch from the durable authority: (1, 2) beats 2 at the fence, and 2 is then refused."""
    resource, durable = files("resource"), EpochAuthority(files("durable"))
    issuer = ReplicatedIssuer(files("primary"), files("replica"), clock, "invoice-run", lag=5)
    issuer.issue()
    old = issuer.issue()
    issuer.failover()                              # both numbers lost
    assert issuer.issuer().start_epoch(durable) == 1
    new = issuer.issue()
    assert (old, new) == (2, (1, 1))
    assert [fenced_write(resource, t) for t in (old, new, old)] == ["ok", "ok", "rejected"]
    assert Fence(resource, "invoice-run").current() == (1, 1)


def test_epoch_survives_a_restore_of_the_issuers_store(files, clock, tmp_path):
    """The epoch lives apart from the restored store: after restore + new epoch, tokens are above all old ones."""
    store, durable = files("store"), EpochAuthority(files("durable"))
    issuer = EpochIssuer(store, "invoice-run")
    issuer.start_epoch(durable)
    issuer.issue()
    backup(store, str(tmp_path / "nightly.db"))
    issued = [issuer.issue() for _ in range(3)]
    restore(store, str(tmp_path / "nightly.db"))
    assert (issued, issuer.current()) == ([(1, 2), (1, 3), (1, 4)], (1, 1))
    assert issuer.start_epoch(durable) == 2
    assert issuer.issue() == (2, 1) and (2, 1) > max(issued)


def test_start_epoch_refuses_an_authority_that_is_not_ahead(files):
    """An epoch that does not move the row's epoch up is refused and changes nothing."""
    store = files("store")
    issuer = EpochIssuer(store, "invoice-run")
    issuer.start_epoch(EpochAuthority(files("durable")))
    issuer.issue()
    with pytest.raises(BadArgument) as caught:
        issuer.start_epoch(EpochAuthority(files("forgetful")))      # gives epoch 1 again
    assert caught.value.argument == "authority"
    assert issuer.current() == (1, 1)


def test_adding_a_constant_is_safe_only_above_every_number_ever_issued(files, clock, tmp_path):
    """Restore at 6 after 9 was issued: +2 gives 9 again (accepted beside the old 9); +1000 is above it."""
    db, resource = files("authority"), files("resource")
    counter = EpochIssuer(db, "invoice-run")
    for _ in range(6):
        counter.issue()
    backup(db, str(tmp_path / "nightly.db"))
    old = [counter.issue() for _ in range(3)]
    assert fenced_write(resource, old[-1]) == "ok"
    restore(db, str(tmp_path / "nightly.db"))
    counter.bump(2)
    reused = counter.issue()
    assert (reused, bump_is_safe(6, 2, max(old))) == (9, False)
    assert [fenced_write(resource, reused), fenced_write(resource, old[-1])] == ["ok", "ok"]  # two holders of 9
    restore(db, str(tmp_path / "nightly.db"))
    counter.bump(1000)
    assert (counter.issue(), bump_is_safe(6, 1000, max(old))) == (1007, True)


def test_bump_is_safe_compares_tokens_with_epochs():
    """bump_is_safe works on (epoch, counter) tokens as the fence orders them."""
    assert bump_is_safe((2, 0), 1, (1, 10 ** 6)) is True
    assert bump_is_safe((1, 5), 5, (1, 10)) is True      # the next token, (1, 11), is above (1, 10)
    assert bump_is_safe((1, 5), 4, (1, 10)) is False     # the next token would be (1, 10) again
    assert bump_is_safe(0, 10, 10) is True and bump_is_safe(0, 9, 10) is False


@pytest.mark.parametrize("call, argument", [
    (lambda f, c: ReplicatedIssuer(f("p"), f("r"), c, "x", lag=-1), "lag"),
    (lambda f, c: ReplicatedIssuer(f("p"), f("r"), c, "", lag=1), "name"),
    (lambda f, c: ReplicatedIssuer(f("p"), f("r"), object(), "x", lag=1), "clock"),
    (lambda f, c: EpochIssuer(f("p"), "x").bump(-1), "constant"),
    (lambda f, c: EpochIssuer(f("p"), "x").bump(True), "constant"),
    (lambda f, c: EpochIssuer(f("p"), "x").start_epoch("durable"), "authority"),
    (lambda f, c: EpochAuthority(f("p")).next_epoch(""), "name"),
    (lambda f, c: bump_is_safe(6, 1.5, 8), "constant"),
    (lambda f, c: bump_is_safe(-6, 1, 8), "restored"),
])
def test_bad_arguments_are_refused_by_name(files, clock, call, argument):
    """Each bad argument raises BadArgument/BadArgumentType naming it."""
    with pytest.raises((BadArgument, BadArgumentType)) as caught:
        call(files, clock)
    assert caught.value.argument == argument


def test_replica_must_be_another_database(files, clock):
    """Replicating a database onto itself is refused naming the replica."""
    db = files("one")
    with pytest.raises(BadArgument) as caught:
        ReplicatedIssuer(db, db, clock, "x", lag=1)
    assert caught.value.argument == "replica"
