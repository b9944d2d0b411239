"""Holes in the core, closed: a protected table's fence cannot be lowered, dropped, shadowed or
outrun behind its back, and run_once cannot be fooled by an effect that ends its transaction or
its savepoint.

Each case runs on both engines (``[sqlite]`` and ``[postgres]``), and twice: through
``tx.conn`` (the raw connection inside a labkit transaction) and through ``bare``, a driver
connection of a writer who never heard of labkit.
"""

import pytest

from labkit import Fence, LabkitError, StaleGeneration, errors, run_once
from labkit.db import execute
from labkit.fence import unfenced

JOB = "invoice-run"
ROUTES = ["tx.conn", "bare"]


def through(route, db, bare, sql, params=()):
    """Run ``sql`` the way ``route`` says: on the raw connection of a labkit transaction, or bare."""
    if route == "tx.conn":
        with unfenced(db) as tx:
            tx.conn.execute(sql, params)
        return
    bare(sql, params)


def refused(route, bare):
    """What a refusal looks like on ``route``: labkit's errors inside labkit, the driver's outside."""
    return LabkitError if route == "tx.conn" else bare.Error


@pytest.fixture
def protected(db):
    """invoices protected, the fence of the invoice run at 8 with B's INV-1."""
    fence = Fence(db, JOB)
    fence.protect("invoices")
    with fence.guard(8) as tx:
        tx.execute("INSERT INTO invoices VALUES ($1, 'INV-1', 120, 8)", (JOB,))
    return fence


def stale_insert_is_refused(route, db, bare):
    """A's INSERT at 7 after B's 8, on ``route``: refused, like every stale row."""
    with pytest.raises((StaleGeneration, bare.Error), match="stale generation"):
        through(route, db, bare, "INSERT INTO invoices VALUES ($1, 'INV-2', 100, 7)", (JOB,))


# --- Fence.protect ------------------------------------------------------------------------------

LOWERINGS = {
    "generation to 0": "UPDATE job_fence SET generation = 0",
    "epoch and generation down": "UPDATE job_fence SET epoch = 0, generation = 7",
    "job_id renamed": "UPDATE job_fence SET job_id = 'gone'",
    "delete": "DELETE FROM job_fence",
    "replace at 0": {
        "sqlite": "INSERT OR REPLACE INTO job_fence VALUES ('invoice-run', 0, 0)",
        "postgres": "INSERT INTO job_fence VALUES ('invoice-run', 0, 0) ON CONFLICT (job_id) "
                    "DO UPDATE SET epoch = 0, generation = 0",
    },
}
#: a shadow of labkit's job_fence in the writer's own temporary schema, at 0
SHADOW = ["CREATE TEMP TABLE job_fence (job_id TEXT PRIMARY KEY, epoch INTEGER NOT NULL, "
          "generation INTEGER NOT NULL)", "INSERT INTO job_fence VALUES ('invoice-run', 0, 0)"]


def dialect(sql, engine):
    return sql[engine] if isinstance(sql, dict) else sql


@pytest.mark.parametrize("how", sorted(LOWERINGS))
@pytest.mark.parametrize("route", ROUTES)
def test_a_protected_databases_fence_cannot_be_lowered_or_deleted(protected, db, bare, dump,
                                                                  route, how, engine):
    """Lowering, renaming or deleting the fence row is refused, so the stale INSERT after it is too."""
    before = dump()
    with pytest.raises(refused(route, bare), match="fence|stale generation"):
        through(route, db, bare, dialect(LOWERINGS[how], engine))
    assert dump() == before and protected.current() == 8
    stale_insert_is_refused(route, db, bare)
    assert dump() == before


def test_a_temp_table_does_not_shadow_the_fence(protected, db, bare, dump):
    """A writer's own TEMP job_fence at 0 is not the fence the triggers read: the stale row is
    refused, and the unprotected path shows what the shadow would do (its 0 would pass 7)."""
    for statement in SHADOW:
        bare(statement)
    assert bare("SELECT generation FROM job_fence").fetchall() == [(0,)]  # the writer sees it
    before = dump()
    with pytest.raises(bare.Error, match="stale generation"):
        bare("INSERT INTO invoices VALUES ($1, 'INV-2', 100, 7)", (JOB,))
    assert dump() == before and protected.current() == 8


def test_a_multi_row_insert_with_any_stale_token_is_refused_whole(protected, db, bare, dump):
    """One INSERT of tokens (10, 9) at fence 8: the first raises the fence to 10, so the second
    is stale, and the whole statement is refused, as row-by-row checking says."""
    before = dump()
    for route in ROUTES:
        with pytest.raises(refused(route, bare), match="stale generation"):
            through(route, db, bare, "INSERT INTO invoices VALUES ($1, 'INV-2', 1, 10), "
                    "($2, 'INV-3', 1, 9)", (JOB, JOB))  # fmt: skip
        assert dump() == before and protected.current() == 8
    through("bare", db, bare, "INSERT INTO invoices VALUES ($1, 'INV-2', 1, 9), ($2, 'INV-3', 1, 10)",
            (JOB, JOB))  # rising: both rows land  # fmt: skip
    assert protected.current() == 10


@pytest.mark.parametrize("route", ROUTES)
def test_a_token_above_every_issued_one_is_refused(protected, db, bare, dump, route, engine,
                                                  request):
    """With the lease authority in the same database (lease_counter at 8 for this job), a row
    carrying 999, a generation nobody was granted, is refused and the fence stays at 8; an
    issued token still passes, and a job without an authority here is not judged."""
    from labkit import LeaseAuthority, VirtualClock

    execute(db, "INSERT INTO lease_counter VALUES ($1, 8)", (JOB,))
    before = dump()
    with pytest.raises(refused(route, bare), match="never issued|issued"):
        through(route, db, bare, "INSERT INTO invoices VALUES ($1, 'INV-2', 1, 999)", (JOB,))
    assert dump() == before and protected.current() == 8
    leases = LeaseAuthority(db, VirtualClock())
    assert leases.acquire(JOB, "C", ttl=1).generation == 9
    through(route, db, bare, "INSERT INTO invoices VALUES ($1, 'INV-2', 1, 9)", (JOB,))
    assert protected.current() == 9
    Fence(db, "elsewhere")
    through(route, db, bare, "INSERT INTO invoices VALUES ('elsewhere', 'INV-1', 1, 999)")
    assert Fence(db, "elsewhere").current() == 999


@pytest.mark.parametrize("route", ROUTES)
def test_an_epoch_fence_refuses_every_plain_token(protected, db, bare, dump, route):
    """Rows compare with the fence in guard's order, (0, token) against (epoch, counter): after
    guard((1, 0)) even token 10**12 is below it."""
    with protected.guard((1, 0)):
        pass
    before = dump()
    with pytest.raises(refused(route, bare), match="stale generation"):
        through(route, db, bare, "INSERT INTO invoices VALUES ($1, 'INV-2', 1, $2)", (JOB, 10**12))
    assert dump() == before and protected.current() == (1, 0)


@pytest.mark.parametrize("route", ROUTES)
def test_the_fence_still_goes_up_on_a_protected_database(protected, db, bare, route):
    """Raising the fence (by guard, by a row, by a bare UPDATE) stays allowed."""
    through(route, db, bare, "UPDATE job_fence SET generation = 9 WHERE job_id = $1", (JOB,))
    through(route, db, bare, "INSERT INTO invoices VALUES ($1, 'INV-2', 1, 10)", (JOB,))
    assert protected.current() == 10
    with protected.guard((1, 0)):
        pass
    assert protected.current() == (1, 0)


@pytest.mark.parametrize("route", ROUTES)
def test_a_row_of_a_job_without_a_fence_row_is_refused_not_given_a_new_fence(protected, db,
                                                                            bare, dump, route):
    """The trigger does not create a fence row (guard treats a missing one as an error): it refuses."""
    before = dump()
    with pytest.raises(refused(route, bare), match="fence row"):
        through(route, db, bare, "INSERT INTO invoices VALUES ('new-job', 'INV-1', 1, 1)")
    assert dump() == before
    assert execute(db, "SELECT job_id FROM job_fence") == [(JOB,)]


@pytest.mark.parametrize("route", ROUTES)
def test_insert_or_ignore_of_an_existing_key_leaves_the_fence_alone(protected, db, bare, route):
    """INSERT ... ON CONFLICT DO NOTHING of INV-1 at 9 writes no row, so it raises no fence either."""
    through(route, db, bare, "INSERT INTO invoices VALUES ($1, 'INV-1', 999, 9) ON CONFLICT DO NOTHING",
            (JOB,))
    assert execute(db, "SELECT amount, generation FROM invoices") == [(120, 8)]
    assert protected.current() == 8
    with protected.guard(8):                   # B, still at 8, is not fenced out by a non-write
        pass


@pytest.mark.parametrize("route", ROUTES)
def test_an_upsert_raises_the_fence_only_by_what_it_writes(protected, db, bare, route):
    """An upsert that updates INV-1 at 9 raises the fence to 9; its ignored insert half counts for nothing."""
    through(route, db, bare, "INSERT INTO invoices VALUES ($1, 'INV-1', 90, 9) ON CONFLICT "
            "(job_id, invoice_id) DO UPDATE SET amount = excluded.amount, "
            "generation = excluded.generation", (JOB,))
    assert execute(db, "SELECT amount, generation FROM invoices") == [(90, 9)]
    assert protected.current() == 9


def test_an_unprotected_database_keeps_the_naive_lessons_unconditional_write(db):
    """Without protect(), lesson 03's naive writer may still move the fence back (that is its lesson)."""
    fence = Fence(db, JOB)
    with fence.guard(8):
        pass
    execute(db, "UPDATE job_fence SET generation = 7 WHERE job_id = $1", (JOB,))
    assert fence.current() == 7


def test_protects_docstring_says_what_it_does_not_cover():
    """The docstring names the gaps (an UPDATE that keeps the token, a DELETE) and drops the old claim."""
    doc = " ".join(Fence.protect.__doc__.split())
    assert "can then no longer write stale" not in doc
    assert "unchanged" in doc and "DELETE" in doc


# --- run_once -----------------------------------------------------------------------------------

def keys(bare):
    """The idempotency keys, read through a bare connection."""
    return [tuple(r) for r in bare("SELECT key, payload, result FROM idempotency_keys").fetchall()]


def sql_on(route, tx, sql):
    """Run ``sql`` in the effect through ``tx.conn`` or through ``tx.execute``."""
    return tx.conn.execute(sql) if route == "tx.conn" else tx.execute(sql)


def not_recorded(caught, key="k"):
    assert isinstance(caught.value, errors.KeyNotRecorded)
    assert caught.value.key == key and repr(key) in str(caught.value)


@pytest.fixture(params=["db", "guard"])
def holder(request, db):
    """Call run_once on the database (its own transaction) or inside a guard's transaction."""
    fence = Fence(db, JOB)

    def call(key, effect):
        if request.param == "db":
            return run_once(db, key, effect)
        with fence.guard(8) as tx:
            return run_once(tx, key, effect)
    return call


@pytest.mark.parametrize("route", ["tx.conn", "tx.execute"])
def test_a_nested_run_once_with_its_own_key_is_a_named_error(holder, db, bare, dump, route):
    """The inner call meets its key in progress: KeyNotRecorded, not a raw TypeError; nothing stays."""
    before = dump()

    def outer(tx):
        sql_on(route, tx, "INSERT INTO invoices VALUES ('job', 'INV-1', 1, 8)")
        return run_once(tx, "k", lambda t: "inner")
    with pytest.raises(LabkitError) as caught:
        holder("k", outer)
    not_recorded(caught)
    assert "again in its own effect" in str(caught.value)
    assert keys(bare) == [] and dump() == before
    assert holder("k", lambda tx: "ran") == "ran"


@pytest.mark.parametrize("route", ["tx.conn", "tx.execute"])
def test_an_effect_that_commits_and_raises_is_named_and_never_repeated(holder, db, bare, route):
    """Its COMMIT made its writes and the key durable: the key stays, and a retry is a named stop
    saying the outcome is unknown (not a raw TypeError, and never a second run of the effect)."""
    calls = []

    def effect(tx):
        calls.append("effect")
        sql_on(route, tx, "INSERT INTO invoices VALUES ('job', 'INV-1', 1, 8)")
        sql_on(route, tx, "COMMIT")
        raise ConnectionError("the provider hung up")
    with pytest.raises(LabkitError) as caught:
        holder("k", effect)
    not_recorded(caught)
    assert isinstance(caught.value.__cause__, ConnectionError)
    assert "idempotency_keys" in str(caught.value)
    assert keys(bare) == [("k", "null", None)] and not db.conn.in_transaction
    with pytest.raises(LabkitError) as retried:
        holder("k", effect)
    not_recorded(retried)
    assert "outcome unknown" in str(retried.value)
    assert calls == ["effect"] and len(execute(db, "SELECT * FROM invoices")) == 1
    execute(db, "DELETE FROM idempotency_keys WHERE key = 'k'")  # what the message says to do
    assert holder("k", lambda tx: "retried") == "retried"


@pytest.mark.parametrize("route", ["tx.conn", "tx.execute"])
def test_an_effect_that_commits_and_returns_is_a_named_error(holder, db, bare, route):
    """Not 'no such savepoint': KeyNotRecorded, saying the effect ended the transaction."""
    def effect(tx):
        sql_on(route, tx, "COMMIT")
        return "done"
    with pytest.raises(LabkitError) as caught:
        holder("k", effect)
    not_recorded(caught)
    assert "COMMIT" in str(caught.value)
    assert keys(bare) == [("k", "null", None)] and not db.conn.in_transaction


@pytest.mark.parametrize("route", ["tx.conn", "tx.execute"])
def test_an_effect_that_commits_and_begins_again_is_caught_too(holder, db, bare, route):
    """COMMIT; BEGIN leaves a transaction open but not run_once's savepoint: still KeyNotRecorded,
    and the transaction the effect began is rolled back."""
    def effect(tx):
        sql_on(route, tx, "COMMIT")
        tx.conn.execute("BEGIN IMMEDIATE")
        tx.conn.execute("INSERT INTO invoices VALUES ('job', 'INV-9', 1, 8)")
        return "done"
    with pytest.raises(LabkitError) as caught:
        holder("k", effect)
    not_recorded(caught)
    assert keys(bare) == [("k", "null", None)] and not db.conn.in_transaction
    assert execute(db, "SELECT * FROM invoices") == []


@pytest.mark.parametrize("route", ["tx.conn", "tx.execute"])
def test_an_effect_that_rolls_back_run_onces_savepoint_is_not_a_success(holder, db, bare, dump,
                                                                        route):
    """ROLLBACK TO run_once removed the key: run_once says so instead of reporting success."""
    before, calls = dump(), []

    def effect(tx):
        calls.append("effect")
        sql_on(route, tx, "INSERT INTO invoices VALUES ('job', 'INV-1', 1, 8)")
        sql_on(route, tx, "ROLLBACK TO run_once")
        return "charged"
    with pytest.raises(LabkitError) as caught:
        holder("k", effect)
    not_recorded(caught)
    assert "ROLLBACK TO" in str(caught.value)
    assert keys(bare) == [] and execute(db, "SELECT * FROM invoices") == []
    assert dump() == before and calls == ["effect"]
