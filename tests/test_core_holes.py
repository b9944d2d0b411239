"""Holes in the core, closed: a protected table's fence cannot be lowered or dropped behind its
back, and run_once cannot be fooled by an effect that ends its transaction or its savepoint.

Each case runs twice: through ``tx.conn`` (the raw connection inside a labkit transaction) and
through a bare ``sqlite3`` connection to the same file, a writer who never heard of labkit.
"""

import sqlite3

import pytest

from labkit import Fence, LabkitError, StaleGeneration, errors, run_once
from labkit.db import execute
from labkit.fence import unfenced

JOB = "invoice-run"
ROUTES = ["tx.conn", "bare"]


def through(route, db, db_path, sql, params=()):
    """Run ``sql`` the way ``route`` says: on the raw connection of a labkit transaction, or bare."""
    if route == "tx.conn":
        with unfenced(db) as tx:
            tx.conn.execute(sql, params)
        return
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute(sql, params)
    finally:
        conn.close()


def refused(route):
    """What a refusal looks like on ``route``: labkit's errors inside labkit, SQLite's outside."""
    return LabkitError if route == "tx.conn" else sqlite3.IntegrityError


@pytest.fixture
def protected(db):
    """invoices protected, the fence of the invoice run at 8 with B's INV-1."""
    fence = Fence(db, JOB)
    fence.protect("invoices")
    with fence.guard(8) as tx:
        tx.execute("INSERT INTO invoices VALUES (?, 'INV-1', 120, 8)", (JOB,))
    return fence


def stale_insert_is_refused(route, db, db_path):
    """A's INSERT at 7 after B's 8, on ``route``: refused, like every stale row."""
    with pytest.raises((StaleGeneration, sqlite3.IntegrityError), match="stale generation"):
        through(route, db, db_path, "INSERT INTO invoices VALUES (?, 'INV-2', 100, 7)", (JOB,))


# --- Fence.protect ------------------------------------------------------------------------------

LOWERINGS = {
    "generation to 0": "UPDATE job_fence SET generation = 0",
    "epoch and generation down": "UPDATE job_fence SET epoch = 0, generation = 7",
    "job_id renamed": "UPDATE job_fence SET job_id = 'gone'",
    "delete": "DELETE FROM job_fence",
    "replace at 0": "INSERT OR REPLACE INTO job_fence VALUES ('invoice-run', 0, 0)",
}


@pytest.mark.parametrize("how", sorted(LOWERINGS))
@pytest.mark.parametrize("route", ROUTES)
def test_a_protected_databases_fence_cannot_be_lowered_or_deleted(protected, db, db_path, dump,
                                                                  route, how):
    """Lowering, renaming or deleting the fence row is refused, so the stale INSERT after it is too."""
    before = dump()
    with pytest.raises(refused(route), match="fence|stale generation"):
        through(route, db, db_path, LOWERINGS[how])
    assert dump() == before and protected.current() == 8
    stale_insert_is_refused(route, db, db_path)
    assert dump() == before


@pytest.mark.parametrize("route", ROUTES)
def test_the_fence_still_goes_up_on_a_protected_database(protected, db, db_path, route):
    """Raising the fence (by guard, by a row, by a bare UPDATE) stays allowed."""
    through(route, db, db_path, "UPDATE job_fence SET generation = 9 WHERE job_id = ?", (JOB,))
    through(route, db, db_path, "INSERT INTO invoices VALUES (?, 'INV-2', 1, 10)", (JOB,))
    assert protected.current() == 10
    with protected.guard((1, 0)):
        pass
    assert protected.current() == (1, 0)


@pytest.mark.parametrize("route", ROUTES)
def test_a_row_of_a_job_without_a_fence_row_is_refused_not_given_a_new_fence(protected, db,
                                                                            db_path, dump, route):
    """The trigger does not create a fence row (guard treats a missing one as an error): it refuses."""
    before = dump()
    with pytest.raises(refused(route), match="fence row"):
        through(route, db, db_path, "INSERT INTO invoices VALUES ('new-job', 'INV-1', 1, 1)")
    assert dump() == before
    assert execute(db, "SELECT job_id FROM job_fence") == [(JOB,)]


@pytest.mark.parametrize("route", ROUTES)
def test_insert_or_ignore_of_an_existing_key_leaves_the_fence_alone(protected, db, db_path, route):
    """INSERT OR IGNORE of INV-1 at 9 writes no row, so it raises no fence either."""
    through(route, db, db_path, "INSERT OR IGNORE INTO invoices VALUES (?, 'INV-1', 999, 9)", (JOB,))
    assert execute(db, "SELECT amount, generation FROM invoices") == [(120, 8)]
    assert protected.current() == 8
    with protected.guard(8):                   # B, still at 8, is not fenced out by a non-write
        pass


@pytest.mark.parametrize("route", ROUTES)
def test_an_upsert_raises_the_fence_only_by_what_it_writes(protected, db, db_path, route):
    """An upsert that updates INV-1 at 9 raises the fence to 9; its ignored insert half counts for nothing."""
    through(route, db, db_path, "INSERT INTO invoices VALUES (?, 'INV-1', 90, 9) ON CONFLICT DO "
            "UPDATE SET amount = excluded.amount, generation = excluded.generation", (JOB,))
    assert execute(db, "SELECT amount, generation FROM invoices") == [(90, 9)]
    assert protected.current() == 9


def test_an_unprotected_database_keeps_the_naive_lessons_unconditional_write(db):
    """Without protect(), lesson 03's naive writer may still move the fence back (that is its lesson)."""
    fence = Fence(db, JOB)
    with fence.guard(8):
        pass
    execute(db, "UPDATE job_fence SET generation = 7 WHERE job_id = ?", (JOB,))
    assert fence.current() == 7


def test_protects_docstring_says_what_it_does_not_cover():
    """The docstring names the gaps (an UPDATE that keeps the token, a DELETE) and drops the old claim."""
    doc = " ".join(Fence.protect.__doc__.split())
    assert "can then no longer write stale" not in doc
    assert "unchanged" in doc and "DELETE" in doc


# --- run_once -----------------------------------------------------------------------------------

def keys(db_path):
    """The idempotency keys, read through a bare connection to the file."""
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute("SELECT key, payload, result FROM idempotency_keys").fetchall()
    finally:
        conn.close()


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
def test_a_nested_run_once_with_its_own_key_is_a_named_error(holder, db, db_path, dump, route):
    """The inner call meets its key in progress: KeyNotRecorded, not a raw TypeError; nothing stays."""
    before = dump()

    def outer(tx):
        sql_on(route, tx, "INSERT INTO invoices VALUES ('job', 'INV-1', 1, 8)")
        return run_once(tx, "k", lambda t: "inner")
    with pytest.raises(LabkitError) as caught:
        holder("k", outer)
    not_recorded(caught)
    assert "again in its own effect" in str(caught.value)
    assert keys(db_path) == [] and dump() == before
    assert holder("k", lambda tx: "ran") == "ran"


@pytest.mark.parametrize("route", ["tx.conn", "tx.execute"])
def test_an_effect_that_commits_and_raises_is_named_and_never_repeated(holder, db, db_path, route):
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
    assert keys(db_path) == [("k", "null", None)] and not db.conn.in_transaction
    with pytest.raises(LabkitError) as retried:
        holder("k", effect)
    not_recorded(retried)
    assert "outcome unknown" in str(retried.value)
    assert calls == ["effect"] and len(execute(db, "SELECT * FROM invoices")) == 1
    execute(db, "DELETE FROM idempotency_keys WHERE key = 'k'")  # what the message says to do
    assert holder("k", lambda tx: "retried") == "retried"


@pytest.mark.parametrize("route", ["tx.conn", "tx.execute"])
def test_an_effect_that_commits_and_returns_is_a_named_error(holder, db, db_path, route):
    """Not 'no such savepoint': KeyNotRecorded, saying the effect ended the transaction."""
    def effect(tx):
        sql_on(route, tx, "COMMIT")
        return "done"
    with pytest.raises(LabkitError) as caught:
        holder("k", effect)
    not_recorded(caught)
    assert "COMMIT" in str(caught.value)
    assert keys(db_path) == [("k", "null", None)] and not db.conn.in_transaction


@pytest.mark.parametrize("route", ["tx.conn", "tx.execute"])
def test_an_effect_that_commits_and_begins_again_is_caught_too(holder, db, db_path, route):
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
    assert keys(db_path) == [("k", "null", None)] and not db.conn.in_transaction
    assert execute(db, "SELECT * FROM invoices") == []


@pytest.mark.parametrize("route", ["tx.conn", "tx.execute"])
def test_an_effect_that_rolls_back_run_onces_savepoint_is_not_a_success(holder, db, db_path, dump,
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
    assert keys(db_path) == [] and execute(db, "SELECT * FROM invoices") == []
    assert dump() == before and calls == ["effect"]
