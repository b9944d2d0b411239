"""Recovery: durable claims with progress, a sweeper that requeues only what did not move, operation ids."""

import pytest

import labkit
from labkit import BadArgument, BadArgumentType, Fence, LeaseLost, StaleGeneration
from labkit.db import execute, transaction
from labkit.mechanisms.recovery import Claim, Claims, operation_key, produce


@pytest.fixture
def claims(db, clock):
    """Claims on ``db`` reading ``clock``."""
    return Claims(db, clock)


def rows(db):
    """The whole claims table."""
    return execute(db, "SELECT job, owner, generation, state, progress, updated_at, version "
                       "FROM claims ORDER BY job")


def test_claim_checkpoint_finish_leave_a_durable_trail(db, claims, clock):
    """Every step is one conditional UPDATE that bumps the version and stamps the time."""
    claims.enqueue("run")
    b = claims.claim("run", "B", 8)
    clock.advance(2)
    b = claims.checkpoint(b, 1)
    clock.advance(1)
    claims.finish(b)
    assert rows(db) == [("run", "B", 8, "done", 1, 3.0, 3)]
    assert claims.claim("run", "C", 9) is None                  # done work is not claimable


def test_only_the_owner_generation_may_checkpoint(claims):
    """A checkpoint from another owner or an old generation is refused with LeaseLost."""
    claims.enqueue("run")
    b = claims.claim("run", "B", 8)
    for impostor in (Claim("run", "C", 8, "claimed", 0, 0.0, 1), Claim("run", "B", 7, "claimed", 0, 0.0, 1)):
        with pytest.raises(LeaseLost):
            claims.checkpoint(impostor, 5)
    assert claims.get("run").progress == 0 and claims.get("run") == b


def test_sweep_requeues_old_unfinished_claims_only(db, claims, clock):
    """Old and claimed: requeued with its progress; fresh, queued or done: untouched."""
    for job in ("crashed", "fresh", "finished", "waiting"):
        claims.enqueue(job)
    crashed = claims.checkpoint(claims.claim("crashed", "B", 8), 2)
    claims.finish(claims.claim("finished", "B", 8))
    clock.advance(20)
    claims.claim("fresh", "C", 9)
    requeued = claims.sweep(older_than=10)
    assert requeued == [crashed]
    assert [(r[0], r[1], r[3], r[4]) for r in rows(db)] == [
        ("crashed", None, "queued", 2), ("finished", "B", "done", 0),
        ("fresh", "C", "claimed", 0), ("waiting", None, "queued", 0)]
    assert claims.claim("crashed", "C", 9).progress == 2         # the retry resumes where B stopped


def naive_requeue(db, seen):
    """A known-wrong sweeper step: requeue by job and age alone, whatever happened since it looked."""
    with transaction(db):
        execute(db, "UPDATE claims SET owner = NULL, state = 'queued' WHERE job = ?", (seen.job,))


@pytest.mark.parametrize("requeue, expected", [
    ("labkit", ("B", "claimed", 3)), ("naive", (None, "queued", 3)),
])
def test_requeue_leaves_a_claim_that_moved_on(db, claims, clock, requeue, expected):
    """The sweeper looked at B's old claim; B checkpointed before the requeue. labkit's conditional
    requeue leaves B alone; the age-only requeue takes the job from a live owner."""
    claims.enqueue("run")
    b = claims.claim("run", "B", 8)
    clock.advance(30)
    [seen] = claims.stale(older_than=10)
    claims.checkpoint(b, 3)                                    # B was slow, not dead
    if requeue == "labkit":
        assert claims.requeue(seen) is False
    else:
        naive_requeue(db, seen)
    row = claims.get("run")
    assert (row.owner, row.state, row.progress) == expected


def test_requeue_refuses_a_finished_claim(claims, clock):
    """A claim finished after the sweeper looked is not requeued."""
    claims.enqueue("run")
    b = claims.claim("run", "B", 8)
    clock.advance(30)
    [seen] = claims.stale(older_than=10)
    claims.finish(b)
    assert (claims.requeue(seen), claims.get("run").state) == (False, "done")


def invoices(db):
    """Invoice ids in the table, in order."""
    return [r[0] for r in execute(db, "SELECT invoice_id FROM invoices ORDER BY invoice_id")]


def test_operation_ids_stop_a_retry_from_repeating_produced_units(db, claims, clock):
    """B produced c1 and c2 but crashed before checkpointing c2; C resumes at c2 and produces only c3 new."""
    fence = Fence(db, "invoice-run")
    claims.enqueue("invoice-run")
    b = claims.claim("invoice-run", "B", 8)
    assert produce(fence, b, "c1", 100, claims=claims, progress=1) is True
    assert produce(fence, b, "c2", 110) is True               # crash before the checkpoint of c2
    clock.advance(30)
    claims.sweep(older_than=10)
    c = claims.claim("invoice-run", "C", 9)
    done = [produce(fence, c, unit, 100 + 10 * n, claims=claims, progress=n + 1)
            for n, unit in enumerate(["c1", "c2", "c3"]) if n >= c.progress]
    assert (c.progress, done) == (1, [False, True])
    assert invoices(db) == ["c1@8", "c2@8", "c3@9"]
    assert execute(db, "SELECT key FROM idempotency_keys ORDER BY key") == [
        ("invoice-run/c1",), ("invoice-run/c2",), ("invoice-run/c3",)]


def test_without_operation_ids_the_retry_bills_twice(db, claims):
    """The same retry without keys: c2 is produced by B and again by C (two rows for one customer)."""
    fence = Fence(db, "invoice-run")
    for generation, unit in ((8, "c1"), (8, "c2"), (9, "c2"), (9, "c3")):
        with fence.guard(generation) as tx:
            tx.execute("INSERT INTO invoices VALUES ('invoice-run', ?, 100, ?)", (f"{unit}@{generation}", generation))
    assert invoices(db) == ["c1@8", "c2@8", "c2@9", "c3@9"]


def test_produce_is_fenced_and_all_or_nothing(db, claims):
    """A stale generation writes nothing; a checkpoint refused inside the transaction rolls the invoice back."""
    fence = Fence(db, "invoice-run")
    claims.enqueue("invoice-run")
    b = claims.claim("invoice-run", "B", 8)
    produce(fence, b, "c1", 100)
    stale = Claim("invoice-run", "A", 7, "claimed", 0, 0.0, 0)
    with pytest.raises(StaleGeneration):
        produce(fence, stale, "c2", 100)
    foreign = Claim("invoice-run", "X", 8, "claimed", 0, 0.0, 0)
    with pytest.raises(LeaseLost):
        produce(fence, foreign, "c3", 100, claims=claims, progress=3)
    assert invoices(db) == ["c1@8"]
    assert execute(db, "SELECT key FROM idempotency_keys") == [("invoice-run/c1",)]
    assert claims.get("invoice-run").progress == 0


def test_checkpoint_refuses_a_tx_of_another_database_or_one_that_ended(db, claims, tmp_path):
    """A checkpoint joined to a guard on another database, or to a guard that has ended, is refused by name."""
    claims.enqueue("invoice-run")
    b = claims.claim("invoice-run", "B", 8)
    other = labkit.connect(str(tmp_path / "other.db"))
    try:
        with Fence(other, "invoice-run").guard(8) as foreign:
            with pytest.raises(BadArgument, match="another database") as caught:
                claims.checkpoint(b, 1, tx=foreign)
            assert caught.value.argument == "tx"
    finally:
        other.conn.close()
    with Fence(db, "invoice-run").guard(8) as ended:
        pass
    with pytest.raises(BadArgument, match="ended"):
        claims.checkpoint(b, 1, tx=ended)
    assert claims.get("invoice-run").progress == 0


def test_operation_key_is_stable():
    """The same job and unit give the same key on every retry."""
    assert operation_key("invoice-run", "c2") == operation_key("invoice-run", "c2") == "invoice-run/c2"


@pytest.mark.parametrize("call, argument", [
    (lambda c: c.enqueue(""), "job"),
    (lambda c: c.claim("run", "B", -1), "generation"),
    (lambda c: c.claim("run", "B", True), "generation"),
    (lambda c: c.stale(older_than=-1), "older_than"),
    (lambda c: c.requeue(("run", 1)), "seen"),
    (lambda c: c.checkpoint("run", 1), "claim"),
    (lambda c: Claims(c.db, object()), "clock"),
])
def test_bad_arguments_are_refused_by_name(claims, call, argument):
    """Bad input raises naming the argument and writes nothing."""
    with pytest.raises((BadArgument, BadArgumentType)) as caught:
        call(claims)
    assert caught.value.argument == argument
    assert rows(claims.db) == []
