"""The fence: the resource remembers the highest token and refuses lower ones."""

import sqlite3
import threading

import pytest

import labkit
from labkit import BadArgument, Fence, LabkitError, StaleGeneration, Tx
from labkit.db import execute, transaction
from labkit.fence import unfenced
from polling import wait_for

INSERT = "INSERT INTO invoices(job_id, invoice_id, amount, generation) VALUES ($1, $2, $3, $4)"


def invoices(db):
    """Every invoice row, ordered."""
    return execute(db, "SELECT job_id, invoice_id, amount, generation FROM invoices ORDER BY 1, 2")


def generation_seven(leases):
    """Six earlier holders come and go, then A acquires a 10 s lease: generation 7."""
    for n in range(6):
        leases.release(leases.acquire("invoice-run", f"earlier-{n}", ttl=10))
    return leases.acquire("invoice-run", "A", ttl=10)


# --- the source's own numbers -------------------------------------------------------

def test_source_story_unfenced_write_from_a_overwrites_bs_invoices(leases, clock, db):
    """Without the fence, A (generation 7) resumes after B (8) and overwrites B's invoice."""
    a = generation_seven(leases)
    assert (a.generation, a.expires_at) == (7, 10.0)
    clock.advance(12)
    b = leases.acquire("invoice-run", "B", ttl=10)
    assert b.generation == 8
    with transaction(db):
        execute(db, INSERT, ("invoice-run", "INV-1", 120, b.generation))
    clock.advance(18)                                          # A wakes at t=30
    with transaction(db):                                      # A's unfenced write
        execute(db, "UPDATE invoices SET amount = $1, generation = $2 WHERE invoice_id = $3",
                (100, a.generation, "INV-1"))
    assert invoices(db) == [("invoice-run", "INV-1", 100, 7)]   # B's work is lost


def test_source_story_fenced_write_from_a_is_rejected_and_writes_nothing(leases, clock, db, dump):
    """With the fence, B commits at 8; A's guard with 7 raises StaleGeneration(7, 8) and writes nothing."""
    fence = Fence(db, "invoice-run")
    a = generation_seven(leases)
    clock.advance(12)
    b = leases.acquire("invoice-run", "B", ttl=10)
    with fence.guard(b.generation) as tx:
        tx.execute(INSERT, ("invoice-run", "INV-1", 120, b.generation))
        tx.execute(INSERT, ("invoice-run", "INV-2", 80, b.generation))
    clock.advance(18)
    before = dump()
    ran = []
    with pytest.raises(StaleGeneration) as caught:
        with fence.guard(a.generation) as tx:
            ran.append("A's block")
            tx.execute("UPDATE invoices SET amount = 100, generation = 7 WHERE invoice_id = 'INV-1'")
    assert (caught.value.offered, caught.value.current, caught.value.job) == (7, 8, "invoice-run")
    assert ran == []
    assert dump() == before
    assert invoices(db) == [("invoice-run", "INV-1", 120, 8), ("invoice-run", "INV-2", 80, 8)]
    assert fence.current() == 8


def test_source_story_two_writes_with_eight_are_both_accepted(db):
    """Equal tokens pass: the owner of generation 8 may write twice."""
    fence = Fence(db, "invoice-run")
    for invoice in ("INV-1", "INV-2"):
        with fence.guard(8) as tx:
            tx.execute(INSERT, ("invoice-run", invoice, 10, 8))
    assert invoices(db) == [("invoice-run", "INV-1", 10, 8), ("invoice-run", "INV-2", 10, 8)]
    assert fence.current() == 8


def test_source_story_a_repeat_within_eight_passes_the_fence_and_only_a_key_stops_it(db):
    """Fencing is not duplicate suppression: a repeated charge at 8 lands twice, unless run_once holds its key."""
    execute(db, "CREATE TABLE charges (job_id TEXT, amount INTEGER, generation INTEGER)")
    fence = Fence(db, "invoice-run")
    charge = "INSERT INTO charges VALUES ('invoice-run', 120, 8)"
    for _ in range(2):                                         # unprotected against repeats
        with fence.guard(8) as tx:
            tx.execute(charge)
    assert execute(db, "SELECT count(*) FROM charges") == [(2,)]
    calls = []

    def effect(tx):
        calls.append(tx.token)
        tx.execute(charge)
        return "charged"
    for _ in range(2):                                         # the key stops the repeat
        with fence.guard(8) as tx:
            assert labkit.run_once(tx, "charge/invoice-run/8", effect) == "charged"
    assert calls == [(0, 8)]
    assert execute(db, "SELECT count(*) FROM charges") == [(3,)]


def test_source_story_a_unique_key_also_stops_the_repeat(db, dump):
    """Inserting the same invoice twice at 8: the primary key refuses the second, and its guard rolls back."""
    fence = Fence(db, "invoice-run")
    with fence.guard(8) as tx:
        tx.execute(INSERT, ("invoice-run", "INV-1", 120, 8))
    before = dump()
    with pytest.raises(LabkitError, match="(?i)unique"):
        with fence.guard(8) as tx:
            tx.execute(INSERT, ("invoice-run", "INV-1", 120, 8))
    assert dump() == before


# --- the fence's rules ----------------------------------------------------------------

def test_a_new_fence_starts_at_zero_and_construction_is_idempotent(db):
    """Fence() creates the permanent row at 0 once; a second Fence() keeps its token."""
    fence = Fence(db, "job")
    assert fence.current() == 0
    with fence.guard(5):
        pass
    assert Fence(db, "job").current() == 5
    assert execute(db, "SELECT job_id, epoch, generation FROM job_fence") == [("job", 0, 5)]


def test_guard_accepts_equal_and_higher_and_refuses_lower(db):
    """The accepted tokens never go down: 3, 3, 5 pass; 4 and 0 are refused."""
    fence = Fence(db, "job")
    outcomes = []
    for offered in (3, 3, 5, 4, 0, 5):
        try:
            with fence.guard(offered):
                outcomes.append((offered, "ok"))
        except StaleGeneration as exc:
            outcomes.append((offered, f"stale<{exc.current}"))
    assert outcomes == [(3, "ok"), (3, "ok"), (5, "ok"), (4, "stale<5"), (0, "stale<5"), (5, "ok")]


def test_epoch_counter_pairs_compare_as_row_values(db):
    """(1, 2) beats (0, 100); afterwards int 100 means (0, 100) and is refused; current() shows the pair."""
    fence = Fence(db, "job")
    with fence.guard(100):
        pass
    with fence.guard((1, 2)):
        pass
    assert fence.current() == (1, 2)
    with pytest.raises(StaleGeneration) as caught:
        with fence.guard(100):
            pass
    assert (caught.value.offered, caught.value.current) == (100, (1, 2))
    with pytest.raises(StaleGeneration):
        with fence.guard((1, 1)):
            pass
    with fence.guard([1, 3]) as tx:
        assert tx.token == (1, 3)
    assert execute(db, "SELECT epoch, generation FROM job_fence") == [(1, 3)]


def test_an_exception_inside_guard_rolls_back_the_writes_and_the_fence(db, dump):
    """A failing block leaves neither its rows nor the raised fence behind."""
    fence = Fence(db, "job")
    before = dump()
    with pytest.raises(ZeroDivisionError):
        with fence.guard(9) as tx:
            tx.execute(INSERT, ("job", "INV-1", 1, 9))
            1 / 0
    assert dump() == before
    assert fence.current() == 0


def test_tx_execute_returns_fully_fetched_lists(db):
    """RETURNING rows come back as a list and COMMIT succeeds (no statement left in progress)."""
    fence = Fence(db, "job")
    with fence.guard(1) as tx:
        returned = tx.execute("INSERT INTO invoices VALUES ('job', 'INV-1', 5, 1), ('job', 'INV-2', 6, 1) "
                              "RETURNING invoice_id")
        assert returned == [("INV-1",), ("INV-2",)] and isinstance(returned, list)
    assert [r[1] for r in invoices(db)] == ["INV-1", "INV-2"]


def test_tx_db_inserts_stay_in_the_guards_transaction(db):
    """A sqlite-utils insert through tx.db rolls back with the guard, and commits with it."""
    fence = Fence(db, "job")
    with pytest.raises(RuntimeError):
        with fence.guard(1) as tx:
            tx.db["invoices"].insert({"job_id": "job", "invoice_id": "INV-1", "amount": 5, "generation": 1})
            raise RuntimeError("crash inside the guard")
    assert invoices(db) == []
    with fence.guard(1) as tx:
        tx.db["invoices"].insert({"job_id": "job", "invoice_id": "INV-1", "amount": 5, "generation": 1})
    assert invoices(db) == [("job", "INV-1", 5, 1)]


def test_tx_execute_after_the_block_is_refused(db, dump):
    """A write through a tx whose block has ended would escape the fence: it is refused and writes nothing."""
    fence = Fence(db, "job")
    with fence.guard(1) as tx:
        pass
    before = dump()
    with pytest.raises(labkit.BadArgument, match="tx"):
        tx.execute(INSERT, ("job", "INV-1", 5, 1))
    assert dump() == before


def test_a_leaked_tx_cannot_write_inside_a_later_plain_transaction(db, dump):
    """A tx kept after its guard ended stays dead even while another transaction is open on its connection."""
    fence = Fence(db, "job")
    with fence.guard(1) as leaked:
        assert (leaked.live, leaked.job, leaked.token) == (True, "job", (0, 1))
    assert leaked.live is False
    before = dump()
    with transaction(db):
        with pytest.raises(labkit.BadArgument) as caught:
            leaked.execute(INSERT, ("job", "INV-1", 5, 1))
        assert caught.value.argument == "tx"
    assert dump() == before


def test_unfenced_yields_a_tx_without_a_job_that_dies_with_its_block(db):
    """unfenced(db, 7) writes without any fence check (the fence stays at 0); its tx has no job and dies after."""
    fence = Fence(db, "job")
    with unfenced(db, 7) as tx:
        assert (tx.job, tx.token, tx.live) == (None, (0, 7), True)
        tx.execute(INSERT, ("job", "INV-1", 5, 7))
    assert (tx.live, fence.current(), invoices(db)) == (False, 0, [("job", "INV-1", 5, 7)])
    with pytest.raises(labkit.BadArgument):
        tx.execute(INSERT, ("job", "INV-2", 5, 7))


def test_only_a_guard_makes_a_tx_with_a_job(db):
    """Tx(conn, token, job) by hand is refused naming job: a job means a fence accepted the token."""
    with pytest.raises(labkit.BadArgument) as caught:
        Tx(db.conn, (0, 9), "job")
    assert caught.value.argument == "job"
    with transaction(db) as conn:                  # a hand-made unfenced Tx still works (as before)
        assert Tx(conn, (0, 1)).execute("SELECT 1") == [(1,)]


def test_a_new_fence_and_a_store_can_be_made_inside_an_open_transaction(db, tmp_path):
    """Fence(db, new job) and a store's schema install join a transaction already open on the connection."""
    from labkit.mechanisms.effects import FencedFileStore
    with Fence(db, "job").guard(1):
        fence, store = Fence(db, "job2"), FencedFileStore(db, tmp_path / "files", "job3")
        assert (fence.current(), store.fence.current()) == (0, 0)
    assert execute(db, "SELECT job_id, generation FROM job_fence ORDER BY job_id") == [
        ("job", 1), ("job2", 0), ("job3", 0)]


def test_ensure_schema_reprobes_under_the_lock_so_a_racing_install_is_not_an_error(db_path):
    """B saw no table, then waited for the lock while A created it: B finds it under the lock and skips."""
    a, b = labkit.connect(db_path), labkit.connect(db_path, busy_timeout_ms=10_000)
    ddl = "CREATE TABLE notes (text TEXT)"
    waiting, result = threading.Event(), []
    b.conn.set_trace_callback(lambda sql: waiting.set() if sql.startswith("BEGIN IMMEDIATE") else None)
    with transaction(a):
        execute(a, ddl)                                   # A's table, not committed yet: B cannot see it
        thread = threading.Thread(target=lambda: result.append(labkit.db.ensure_schema(b, "notes", ddl)))
        thread.start()
        assert waiting.wait(15)                           # B probed (nothing) and now waits for the lock
        assert thread.is_alive() and result == []
    thread.join()
    assert result == [False]
    assert execute(b, "SELECT count(*) FROM sqlite_master WHERE name = 'notes'") == [(1,)]


def test_a_deleted_fence_row_is_an_error_not_a_reset(db, dump):
    """If someone deletes the fence row, guard refuses instead of starting again at 0."""
    fence = Fence(db, "job")
    with fence.guard(8):
        pass
    execute(db, "DELETE FROM job_fence")
    before = dump()
    with pytest.raises(LabkitError, match="never be reset"):
        with fence.guard(7):
            pass
    assert dump() == before


def test_fences_of_different_jobs_are_independent(db):
    """Raising one job's fence does not touch another's."""
    one, two = Fence(db, "one"), Fence(db, "two")
    with one.guard(9):
        pass
    with two.guard(1):
        pass
    assert (one.current(), two.current()) == (9, 1)


def test_two_connections_b_waits_for_as_guard_then_a_is_fenced_out(reopen):
    """A holds the write lock (PostgreSQL: the fence row) inside guard(7); B's guard(8) waits, then
    commits; A's next guard(7) fails."""
    conn_a, conn_b = reopen(), reopen(busy_timeout_ms=20000)
    fence_a, fence_b = Fence(conn_a, "invoice-run"), Fence(conn_b, "invoice-run")
    b_started, order = threading.Event(), []

    def run_b():
        b_started.set()
        with fence_b.guard(8) as tx:
            order.append("B in")
            tx.execute(INSERT, ("invoice-run", "INV-1", 120, 8))

    with fence_a.guard(7) as tx:
        order.append("A in")
        thread = threading.Thread(target=run_b)
        thread.start()
        b_started.wait()
        thread.join(timeout=0.3)           # B cannot get in while A holds the lock
        order.append("A commits")
        assert thread.is_alive()
    thread.join()
    assert order == ["A in", "A commits", "B in"]
    with pytest.raises(StaleGeneration):
        with fence_a.guard(7) as tx:
            tx.execute(INSERT, ("invoice-run", "INV-2", 100, 7))
    assert invoices(conn_a) == [("invoice-run", "INV-1", 120, 8)]


# --- Fence.protect: the resource enforces its own fence ----------------------------------

def test_unprotected_table_lets_a_bypassing_writer_write_stale(db, bare):
    """Without protect(), a writer who skips the guard writes generation 7 after the fence reached 8."""
    fence = Fence(db, "invoice-run")
    with fence.guard(8) as tx:
        tx.execute(INSERT, ("invoice-run", "INV-1", 120, 8))
    bare(INSERT, ("invoice-run", "INV-2", 100, 7))
    assert invoices(db)[-1] == ("invoice-run", "INV-2", 100, 7)


def test_protected_table_refuses_a_bypassing_writer_in_sqlite_itself(db, bare, dump):
    """After protect(), a plain driver INSERT with 7 fails inside the database and writes nothing."""
    fence = Fence(db, "invoice-run")
    fence.protect("invoices")
    with fence.guard(8) as tx:
        tx.execute(INSERT, ("invoice-run", "INV-1", 120, 8))
    before = dump()
    with pytest.raises(bare.Error, match="labkit: stale generation"):
        bare(INSERT, ("invoice-run", "INV-2", 100, 7))
    with pytest.raises(bare.Error, match="labkit: stale generation"):
        bare("UPDATE invoices SET amount = 0, generation = 7")
    assert dump() == before


def test_a_protected_write_raises_the_fence_in_the_same_statement(db, bare):
    """A bare INSERT with 9 raises the fence to 9, so the guard with 8 is then refused."""
    fence = Fence(db, "invoice-run")
    fence.protect("invoices")
    bare(INSERT, ("invoice-run", "INV-1", 120, 9))
    assert fence.current() == 9
    with pytest.raises(StaleGeneration):
        with fence.guard(8):
            pass


def test_labkit_calls_report_the_triggers_refusal_as_stale_generation(db, dump, engine):
    """labkit.db.execute turns the trigger's refusal into StaleGeneration, with offered/current/job when bound by name
    (SQLite's names: PostgreSQL binds by position only)."""
    fence = Fence(db, "invoice-run")
    fence.protect("invoices")
    execute(db, INSERT, ("invoice-run", "INV-1", 120, 8))
    before = dump()
    with pytest.raises(StaleGeneration) if engine == "sqlite" else pytest.raises(BadArgument, match="params") as named:
        execute(db, "INSERT INTO invoices VALUES (:job_id, :invoice_id, :amount, :generation)",
                {"job_id": "invoice-run", "invoice_id": "INV-2", "amount": 1, "generation": 7})
    if engine == "sqlite":
        assert (named.value.offered, named.value.current, named.value.job) == (7, 8, "invoice-run")
    with pytest.raises(StaleGeneration) as positional:
        execute(db, INSERT, ("invoice-run", "INV-2", 1, 7))
    assert (positional.value.offered, positional.value.current) == (None, None)
    assert "stale generation" in str(positional.value)
    assert dump() == before


def test_a_stale_row_inside_a_guard_rolls_back_the_whole_guard(db, dump):
    """guard(8) accepted, but a row carrying 7 into a protected table aborts the guard: nothing of it stays."""
    fence = Fence(db, "invoice-run")
    fence.protect("invoices")
    with fence.guard(8):
        pass
    before = dump()
    with pytest.raises(StaleGeneration):
        with fence.guard(8) as tx:
            tx.execute(INSERT, ("invoice-run", "INV-1", 1, 8))
            tx.execute(INSERT, ("invoice-run", "INV-2", 1, 7))
    assert dump() == before


def test_a_sqlite_utils_insert_of_a_stale_row_inside_a_guard_is_stale_generation(db, dump):
    """tx.db["invoices"].insert with a stale row: the guard rolls back and reports StaleGeneration."""
    fence = Fence(db, "invoice-run")
    fence.protect("invoices")
    with fence.guard(8):
        pass
    before = dump()
    with pytest.raises(StaleGeneration) as caught:
        with fence.guard(8) as tx:
            tx.db["invoices"].insert({"job_id": "invoice-run", "invoice_id": "INV-1", "amount": 1,
                                      "generation": 7})
    assert caught.value.offered is None
    assert dump() == before


def test_a_multi_row_insert_with_one_stale_row_writes_no_row(db, db_path, dump):
    """The whole statement is aborted, the good rows with it."""
    Fence(db, "invoice-run").protect("invoices")
    execute(db, INSERT, ("invoice-run", "INV-0", 1, 8))
    before = dump()
    with pytest.raises(StaleGeneration):
        execute(db, "INSERT INTO invoices VALUES ('invoice-run', 'INV-1', 1, 9), ('invoice-run', 'INV-2', 1, 7)")
    assert dump() == before


def test_protected_rows_must_carry_an_integer_token_and_a_job(db, dump):
    """NULL, text and real tokens, and a NULL job_id, are refused (labkit names the column)."""
    execute(db, "CREATE TABLE notes (job_id TEXT, body TEXT, generation)")
    Fence(db, "job").protect("notes")
    before = dump()
    for token in (None, "eight", 7.5):
        with pytest.raises(labkit.BadArgumentType, match="generation"):
            execute(db, "INSERT INTO notes VALUES ('job', 'x', $1)", (token,))
    with pytest.raises(labkit.BadArgument, match="job_id"):
        execute(db, "INSERT INTO notes VALUES (NULL, 'x', 3)")
    assert dump() == before


def test_protect_refuses_every_int_while_the_fence_has_an_epoch(db):
    """With the fence at (1, 0), a row's int token n means (0, n) and is stale."""
    fence = Fence(db, "job")
    fence.protect("invoices")
    with fence.guard((1, 0)):
        pass
    with pytest.raises(StaleGeneration):
        execute(db, INSERT, ("job", "INV-1", 1, 10 ** 9))
    assert invoices(db) == []


def test_protect_is_idempotent_and_counts_existing_rows(db, dump):
    """protect() raises each job's fence to its highest existing row, and a second call changes nothing."""
    execute(db, INSERT, ("job", "INV-1", 1, 4))
    execute(db, INSERT, ("other", "INV-1", 1, 6))
    fence = Fence(db, "job")
    fence.protect("invoices")
    assert (fence.current(), Fence(db, "other").current()) == (4, 6)
    before = dump()
    fence.protect("invoices")
    Fence(db, "other").protect("invoices")
    assert dump() == before


def test_protect_holds_for_new_connections_and_an_update_at_the_current_token(db, reopen):
    """The triggers live in the file: a new connection is fenced too; an update carrying 8 at fence 8 passes."""
    Fence(db, "job").protect("invoices")
    execute(db, INSERT, ("job", "INV-1", 1, 8))
    other = reopen()
    with pytest.raises(StaleGeneration):
        execute(other, "UPDATE invoices SET amount = 2, generation = 7")
    execute(other, "UPDATE invoices SET amount = 3, generation = 8")
    assert invoices(db) == [("job", "INV-1", 3, 8)]


@pytest.mark.parametrize("table, column, argument", [
    ("no_such_table", "generation", "table"),
    ("leases", "generation", "table"),           # labkit's own table
    ("job_fence", "generation", "table"),
    ("invoices", "no_such_column", "column"),
    ("nojob", "generation", "table"),            # no job_id column
    ("v_invoices", "generation", "table"),       # a view
])
def test_protect_refuses_unusable_tables_and_changes_nothing(db, dump, table, column, argument):
    """protect() on a missing table, a view, labkit's tables, or one without job_id/column raises BadArgument."""
    execute(db, "CREATE TABLE nojob (id TEXT, generation INTEGER)")
    execute(db, "CREATE VIEW v_invoices AS SELECT * FROM invoices")
    fence = Fence(db, "job")
    before = dump()
    with pytest.raises(labkit.BadArgument, match=argument):
        fence.protect(table, column)
    assert dump() == before


def test_protect_quotes_sql_looking_table_and_column_names(db):
    """A table and a column named like an injection are protected as names; invoices survives."""
    table, column = "x'); DROP TABLE invoices;--", 'gen"; DROP TABLE leases;--'
    execute(db, f'CREATE TABLE "{table}" (job_id TEXT, "{column.replace(chr(34), chr(34) * 2)}" INTEGER)')
    fence = Fence(db, "job")
    fence.protect(table, column)
    execute(db, f'INSERT INTO "{table}" VALUES ($1, $2)', ("job", 5))
    with pytest.raises(StaleGeneration):
        execute(db, f'INSERT INTO "{table}" VALUES ($1, $2)', ("job", 4))
    assert fence.current() == 5
    assert execute(db, f'SELECT * FROM "{table}"') == [("job", 5)]
    assert execute(db, "SELECT count(*) FROM invoices") == execute(db, "SELECT count(*) FROM leases")


def blocked(engine, waiter, reopen, statement="BEGIN IMMEDIATE"):
    """A test of whether ``waiter`` (a labkit or a driver connection) now waits for a lock that
    another connection holds: on PostgreSQL in pg_locks; on SQLite, it began ``statement``."""
    if engine == "postgres":
        observer, pid = reopen(), getattr(waiter, "pg", waiter).info.backend_pid
        sql = "SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted"
        return lambda: execute(observer, sql, (pid,)) == [(1,)]
    began = threading.Event()
    getattr(waiter, "conn", waiter).set_trace_callback(
        lambda sql: began.set() if sql.startswith(statement) else None)
    return began.is_set


def test_two_connections_making_the_same_new_fence_at_once_both_succeed(engine, reopen):
    """B makes Fence(job) while A's transaction making it is still open: B waits, then finds A's
    row instead of failing on the duplicate; the fence is made once, at 0."""
    a, b = reopen(), reopen(busy_timeout_ms=20000)
    waiting, made = blocked(engine, b, reopen), []
    with transaction(a):
        Fence(a, "new-job")
        thread = threading.Thread(target=lambda: made.append(Fence(b, "new-job").current()))
        thread.start()
        wait_for(waiting, "B to wait for A's lock")
    thread.join()
    assert made == [0]
    assert execute(a, "SELECT * FROM job_fence WHERE job_id = 'new-job'") == [("new-job", 0, 0)]


def test_a_bare_writer_waits_for_an_open_guard_then_is_judged_by_the_committed_fence(
        engine, db, bare, reopen):
    """A guard(9) is open when a bare writer inserts a row with 8 into the protected table: the
    writer waits (SQLite: the file lock; PostgreSQL: the fence row), then is refused, since the
    fence it is judged by is the committed 9, not the 0 it would have seen before."""
    fence = Fence(db, "job")
    fence.protect("invoices")
    waiting, outcome = blocked(engine, bare.conn, reopen, "INSERT"), []

    def write():
        try:
            bare(INSERT, ("job", "INV-8", 1, 8))
            outcome.append("written")
        except bare.Error as exc:
            outcome.append(str(exc).splitlines()[0])
    with fence.guard(9) as tx:
        tx.execute(INSERT, ("job", "INV-9", 1, 9))
        thread = threading.Thread(target=write)
        thread.start()
        wait_for(waiting, "the bare writer to wait for the guard")
    thread.join()
    assert outcome == ["labkit: stale generation"]
    assert invoices(db) == [("job", "INV-9", 1, 9)] and fence.current() == 9


# --- Fence.protect with epochs, and tokens that were never issued (issue 24) ----------------------

@pytest.fixture
def sqlite_db(tmp_path):
    """A SQLite file: the rules below are SQLite's triggers (PostgreSQL's mirror them in issue 25)."""
    return labkit.connect(str(tmp_path / "protect.db"))


EPOCH_TABLE = """CREATE TABLE reports (job_id TEXT NOT NULL, name TEXT NOT NULL, body TEXT,
    epoch INTEGER NOT NULL, generation INTEGER NOT NULL, PRIMARY KEY (job_id, name))"""
REPORT = "INSERT OR REPLACE INTO reports VALUES ($1, $2, $3, $4, $5)"


def test_a_protected_table_with_an_epoch_column_compares_tokens_as_guard_does(sqlite_db):
    """Rows carry (epoch, generation): after guard((1, 1)) the epoch-1 holder's own row passes, a bypassing
    writer's (0, 900) and (1, 0) are refused, and (1, 2) raises the fence to (1, 2)."""
    db = sqlite_db
    dump = lambda: (execute(db, "SELECT * FROM job_fence ORDER BY 1"), execute(db, "SELECT * FROM invoices ORDER BY 1, 2"), execute(db, "SELECT * FROM reports ORDER BY 1, 2") if "reports" in db.table_names() else None)
    execute(db, EPOCH_TABLE)
    fence = Fence(db, "invoice-run")
    fence.protect("reports")
    with fence.guard(900) as tx:
        tx.execute(REPORT, ("invoice-run", "r", "old", 0, 900))
    with fence.guard((1, 1)) as tx:
        tx.execute(REPORT, ("invoice-run", "r", "new", 1, 1))      # the rightful epoch-1 holder
    before = dump()
    for stale in ((0, 900), (0, 10 ** 9), (1, 0)):
        with pytest.raises(StaleGeneration):
            execute(db, REPORT, ("invoice-run", "r", "bypass", *stale))
    assert dump() == before and fence.current() == (1, 1)
    execute(db, REPORT, ("invoice-run", "s", "next", 1, 2))
    assert fence.current() == (1, 2)
    with pytest.raises(StaleGeneration):
        with fence.guard((1, 1)):
            pass


def test_protect_raises_each_fence_to_the_highest_epoch_pair_already_stored(sqlite_db):
    """Rows already in an epoch table raise their jobs' fences to their highest (epoch, generation)."""
    db = sqlite_db
    execute(db, EPOCH_TABLE)
    for row in (("a", "x", "", 0, 50), ("a", "y", "", 2, 3), ("a", "z", "", 1, 99), ("b", "x", "", 0, 4)):
        execute(db, REPORT, row)
    Fence(db, "a").protect("reports")
    assert (Fence(db, "a").current(), Fence(db, "b").current()) == ((2, 3), 4)


def test_a_second_table_whose_rows_are_below_the_fence_can_be_protected_later(sqlite_db):
    """Once one table is protected, protecting another whose rows are at or below the fence (the job
    moved on through the first) works: it lowers and raises no fence, and its stale rows are refused."""
    db = sqlite_db
    execute(db, EPOCH_TABLE)
    execute(db, REPORT, ("job", "old", "", 0, 3))
    fence = Fence(db, "job")
    fence.protect("invoices")
    with fence.guard(5) as tx:
        tx.execute(INSERT, ("job", "INV-1", 100, 5))
    fence.protect("reports")
    assert fence.current() == 5
    with pytest.raises(StaleGeneration):
        execute(db, REPORT, ("job", "late", "", 0, 4))
    execute(db, REPORT, ("job", "new", "", 0, 6))
    assert fence.current() == 6


def test_where_the_authority_lives_a_token_never_issued_is_refused(sqlite_db, clock):
    """The lease authority in the same file has issued 1..7: a bypassing writer's 10**9 (or 8, not yet
    issued) is refused and the fence stays; once 8 is issued, its holder writes."""
    db = sqlite_db
    dump = lambda: (execute(db, "SELECT * FROM job_fence ORDER BY 1"), execute(db, "SELECT * FROM invoices ORDER BY 1, 2"), execute(db, "SELECT * FROM reports ORDER BY 1, 2") if "reports" in db.table_names() else None)
    leases = labkit.LeaseAuthority(db, clock)
    a = generation_seven(leases)
    fence = Fence(db, "invoice-run")
    fence.protect("invoices")
    with fence.guard(a.generation) as tx:
        tx.execute(INSERT, ("invoice-run", "INV-1", 100, 7))
    before = dump()
    for forged in (10 ** 9, 8):
        with pytest.raises(labkit.BadArgument, match="above every one issued"):
            execute(db, INSERT, ("invoice-run", "INV-2", 1, forged))
    assert dump() == before and fence.current() == 7
    clock.advance(11)
    b = leases.acquire("invoice-run", "B", ttl=10)
    execute(db, INSERT, ("invoice-run", "INV-2", 120, b.generation))
    assert fence.current() == 8


def test_where_no_authority_lives_a_token_is_no_credential(db):
    """Without the authority's counter in this file, protect cannot tell a forged token: 10**9 lands and
    raises the fence for good (the README and lesson 03 say so)."""
    fence = Fence(db, "invoice-run")
    fence.protect("invoices")
    execute(db, INSERT, ("invoice-run", "INV-1", 1, 10 ** 9))
    assert fence.current() == 10 ** 9
    with pytest.raises(StaleGeneration):
        with fence.guard(8):
            pass
