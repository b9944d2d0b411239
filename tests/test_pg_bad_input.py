"""PostgreSQL's own bad input: a wrong URL, a refused password, a server that goes away mid-write,
and a crash with a restart. Each gives a named labkit error that says what to do, and nothing
half-written stays. Also what PostgreSQL does differently from SQLite at the seam."""

from __future__ import annotations

import sys
import threading

import pytest

import labkit
from engines import require_postgres
from labkit import BadArgument, Fence, LabkitError, LeaseAuthority, StaleGeneration, run_once
from labkit.db import execute
from labkit.engines.postgres import PostgresServer
from labkit.engines.postgres_db import ServerGone
from labkit.engines.servers import free_port
from polling import wait_for

pytestmark = pytest.mark.usefixtures("_postgres")


@pytest.fixture
def _postgres():
    require_postgres()


@pytest.fixture
def engine():
    """Every test here is on PostgreSQL (``target``, ``bare`` and ``dump`` follow it)."""
    return "postgres"


@pytest.fixture
def own_server():
    """A server of this test's own, with PostgreSQL's default durability, to crash at will."""
    with PostgresServer() as server:
        yield server


def tables(server) -> list[str]:
    """The tables in the server's ``postgres`` database, read as its superuser."""
    import psycopg

    with psycopg.connect(server.url) as conn:
        sql = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        return sorted(name for (name,) in conn.execute(sql))


# --- connecting ------------------------------------------------------------------------------


@pytest.mark.parametrize("url, says", [
    ("postgresql://labkit@127.0.0.1:notaport/postgres", "port must be a number"),
    ("postgresql://labkit@127.0.0.1/postgres?colour=blue", "libpq URI"),
    ("postgres:/127.0.0.1/postgres", "must start with postgresql://"),
])
def test_a_malformed_url_names_url_and_says_what_a_url_looks_like(url, says):
    """A URL that cannot be parsed is a BadArgument naming url, before any connection."""
    with pytest.raises(BadArgument, match=says) as caught:
        labkit.connect(url)
    assert caught.value.argument == "url"


def test_a_refused_password_names_url_and_writes_nothing(pg_server, pg_schema):
    """A wrong password: BadArgument naming url, telling to check the password; nothing installed."""
    before = pg_schema.dump()
    url = pg_server.url_for(password="guessed", options=f"-csearch_path={pg_schema.name}")
    with pytest.raises(BadArgument, match="refused the password: check the password") as caught:
        labkit.connect(url)
    assert caught.value.argument == "url"
    assert "guessed" not in str(caught.value) and pg_server.password not in str(caught.value)
    assert pg_schema.dump() == before == [("triggers", [])]


def test_a_missing_database_names_url(pg_server):
    """A database that does not exist: BadArgument naming url, saying to check the database."""
    with pytest.raises(BadArgument, match="does not exist; check the user and database"):
        labkit.connect(pg_server.url_for("no_such_db"))


def test_no_server_at_the_address_is_server_gone_saying_how_to_start_one():
    """Nothing listening on the port: ServerGone, which says how to start a server."""
    url = f"postgresql://labkit:pw@127.0.0.1:{free_port()}/postgres"
    with pytest.raises(ServerGone, match="no PostgreSQL server answers .* start one") as caught:
        labkit.connect(url)
    assert ":pw@" not in str(caught.value) and isinstance(caught.value, LabkitError)


# --- a server that goes away, and one that comes back -----------------------------------------


def test_a_server_killed_mid_transaction_is_server_gone_and_nothing_half_written(own_server):
    """The server dies inside a guard after one of two writes: ServerGone, which says to
    reconnect and retry; after a restart neither write nor the raised fence is there."""
    db = labkit.connect(own_server.url)
    fence = Fence(db, "job")
    with fence.guard(3) as tx:
        tx.execute("INSERT INTO invoices VALUES ('job', 'INV-1', 10, 3)")
    with pytest.raises(ServerGone, match="reconnect with labkit.connect") as caught:
        with fence.guard(4) as tx:
            tx.execute("INSERT INTO invoices VALUES ('job', 'INV-2', 20, 4)")
            own_server.kill()
            tx.execute("INSERT INTO invoices VALUES ('job', 'INV-3', 30, 4)")
    assert "nothing half-written" in str(caught.value)
    with pytest.raises(ServerGone):  # the handle stays dead, and says so
        execute(db, "SELECT 1")
    own_server.restart()
    again = labkit.connect(own_server.url)
    assert Fence(again, "job").current() == 3
    assert execute(again, "SELECT invoice_id FROM invoices") == [("INV-1",)]
    again.conn.close()


def test_a_server_killed_and_restarted_keeps_every_committed_fence_counter_and_key(own_server):
    """SIGKILL the server and its backends, start it again: fences, lease counters, leases and
    keys are all there, and the next generation continues the count."""
    clock = labkit.VirtualClock()
    db = labkit.connect(own_server.url)
    leases = LeaseAuthority(db, clock)
    for n in range(5):
        leases.release(leases.acquire("job", f"holder-{n}", ttl=10))
    held = leases.acquire("job", "A", ttl=10)
    fences = {job: Fence(db, job) for job in ("job", "other")}
    with fences["job"].guard(held.generation) as tx:
        run_once(tx, "charge-1", lambda t: t.execute("INSERT INTO invoices VALUES "
                                                     "('job', 'INV-1', 10, 6) RETURNING amount"))
    with fences["other"].guard((2, 7)):
        pass
    fences["job"].protect("invoices")
    own_server.kill()
    db.conn.close()
    assert not own_server.running
    own_server.restart()
    db = labkit.connect(own_server.url)
    leases = LeaseAuthority(db, clock)
    assert leases.current("job") == held
    assert (Fence(db, "job").current(), Fence(db, "other").current()) == (6, (2, 7))
    assert run_once(db, "charge-1", lambda t: "never again") == [[10]]
    clock.advance(10)
    assert leases.acquire("job", "B", ttl=10).generation == 7
    with pytest.raises(StaleGeneration):  # the trigger survived the crash too
        execute(db, "INSERT INTO invoices VALUES ('job', 'INV-2', 1, 5)")
    db.conn.close()


# --- what the seam does on PostgreSQL ------------------------------------------------------


def test_one_statement_with_its_placeholders_runs_on_both_engines_as_written(pg_schema, tmp_path):
    """``$1, $2, ...`` are PostgreSQL's own placeholders and parameters named 1, 2, ... to SQLite:
    the same text, sent unchanged, binds the same values on both (quoted ``?``, ``:x`` and ``%``
    are only text)."""
    sql = "SELECT $2 + 0, $1 || '', '?', ':x', '5 % 2', $2 * 2"
    for db in (labkit.connect(str(tmp_path / "one.db")), labkit.connect(pg_schema.url)):
        assert execute(db, sql, ("a", 21)) == [(21, "a", "?", ":x", "5 % 2", 42)], db
        assert execute(db, sql, range(20, 22)) == [(21, "20", "?", ":x", "5 % 2", 42)], db
        # a $n in quoted text, a quoted name or a comment is no placeholder: it is not counted
        assert execute(db, "SELECT $1 || ' costs $5' AS \"a$3\" -- and $9", ("it",)) == [("it costs $5",)]
        with pytest.raises(BadArgument, match=r"params: 1 values for \$1..\$2"):
            execute(db, "SELECT $1 || '', $2 || ''", ("only one",))
        db.conn.close()


def test_sqlite_users_need_no_psycopg():
    """Importing labkit and using SQLite never imports psycopg (checked in a fresh interpreter)."""
    import subprocess
    import sys

    code = ("import sys, labkit; db = labkit.connect(); labkit.Fence(db, 'j'); "
            "print('psycopg' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_without_psycopg_a_postgresql_url_says_what_to_install(monkeypatch):
    """A PostgreSQL URL without psycopg installed: a LabkitError naming the pip package."""
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now raises ImportError
    with pytest.raises(LabkitError, match=r"pip install 'psycopg\[binary\]'"):
        labkit.connect("postgresql://labkit@127.0.0.1/postgres")


def test_tx_db_is_refused_on_postgres(pg_schema):
    """tx.db is sqlite-utils: on PostgreSQL it is a named error, and the guard rolls back."""
    db = labkit.connect(pg_schema.url)
    fence = Fence(db, "job")
    with pytest.raises(BadArgument, match="tx.db is sqlite-utils, for SQLite only") as caught:
        with fence.guard(5) as tx:
            tx.db["invoices"].insert({"job_id": "job"})
    assert caught.value.argument == "tx" and fence.current() == 0
    db.conn.close()


def test_protected_rows_need_a_token_and_a_job_on_postgres(pg_schema, bare):
    """A NULL token, a NULL job and a job without a fence row are refused; a text token column
    cannot be protected at all; the fence row cannot be lowered, deleted or truncated."""
    db = labkit.connect(pg_schema.url)
    execute(db, "CREATE TABLE notes (job_id TEXT, body TEXT, generation BIGINT, label TEXT)")
    fence = Fence(db, "job")
    fence.protect("notes")
    before = pg_schema.dump()
    with pytest.raises(labkit.BadArgumentType, match="generation"):
        execute(db, "INSERT INTO notes VALUES ('job', 'x', NULL, '')")
    with pytest.raises(BadArgument, match="job_id"):
        execute(db, "INSERT INTO notes VALUES (NULL, 'x', 3, '')")
    with pytest.raises(LabkitError, match="no fence row"):
        execute(db, "INSERT INTO notes VALUES ('nobody', 'x', 3, '')")
    with pytest.raises(BadArgument, match="not an integer column") as caught:
        fence.protect("notes", "label")
    assert caught.value.argument == "column"
    for sql in ("UPDATE job_fence SET generation = -1", "DELETE FROM job_fence",
                "TRUNCATE job_fence", "UPDATE job_fence SET job_id = 'renamed'"):
        with pytest.raises(bare.Error, match="labkit: "):
            bare(sql)
    assert pg_schema.dump() == before
    db.conn.close()


@pytest.mark.parametrize("table, column, argument", [
    ("no_such_table", "generation", "table"),
    ("leases", "generation", "table"),
    ("invoices", "no_such_column", "column"),
    ("nojob", "generation", "table"),
    ("v_invoices", "generation", "table"),
])
def test_protect_refuses_unusable_tables_on_postgres(pg_schema, table, column, argument):
    """A missing table, a view, labkit's own, no job_id or no such column: BadArgument, no change."""
    db = labkit.connect(pg_schema.url)
    execute(db, "CREATE TABLE nojob (id TEXT, generation BIGINT)")
    execute(db, "CREATE VIEW v_invoices AS SELECT * FROM invoices")
    fence = Fence(db, "job")
    before = pg_schema.dump()
    with pytest.raises(BadArgument, match=argument):
        fence.protect(table, column)
    assert pg_schema.dump() == before
    db.conn.close()


def pause_after(db, matches):
    """Make ``db`` stop after its first statement for which ``matches(sql)``, until ``go``."""
    paused, go, real_run = threading.Event(), threading.Event(), db.run

    def run(sql, *args):
        result = real_run(sql, *args)
        if matches(sql):
            paused.set()
            go.wait(30)
        return result

    db.run = run
    return paused, go


def race(first, second, *, paused, go, waiter, observer) -> None:
    """Run ``first`` until it pauses, then ``second``; once ``waiter`` waits on a lock, go on."""
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert paused.wait(30)
    threads[1].start()
    sql = "SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted"
    try:
        wait_for(lambda: execute(observer, sql, (waiter.pg.info.backend_pid,)) == [(1,)], "a wait")
    finally:
        go.set()
    for thread in threads:
        thread.join()


def test_two_acquirers_racing_for_an_expired_lease_never_both_win(pg_schema):
    """A has won generation 2 but not committed; B's try_acquire then waits on the name's counter
    row, and after A's COMMIT sees A's lease: B gets None, not a second holder (PostgreSQL's row
    lock, where SQLite had BEGIN IMMEDIATE)."""
    clock = labkit.VirtualClock()
    a_db, b_db, observer = (labkit.connect(pg_schema.url) for _ in range(3))
    LeaseAuthority(a_db, clock).acquire("job", "X", ttl=10)
    clock.advance(10)
    got = {}
    # A stops after writing its lease, before COMMIT
    paused, go = pause_after(a_db, lambda sql: sql.startswith("INSERT INTO leases"))

    def acquire(name, db):
        got[name] = LeaseAuthority(db, clock).try_acquire("job", name, ttl=10)

    race(lambda: acquire("A", a_db), lambda: acquire("B", b_db), paused=paused, go=go,
         waiter=b_db, observer=observer)  # fmt: skip
    assert (got["A"].generation, got["B"]) == (2, None)
    assert LeaseAuthority(observer, clock).current("job") == got["A"]
    for db in (a_db, b_db, observer):
        db.conn.close()


def test_a_renewal_racing_a_successor_is_lost_not_silently_overwritten(pg_schema):
    """A's renew (its clock at 9.9) meets B's acquire (at 10) of A's expiring lease, B first: A's
    renew waits on the counter row, then raises LeaseLost; without that lock it would commit and
    B would overwrite it, two holders each sure of its lease."""
    a_db, b_db, observer = (labkit.connect(pg_schema.url) for _ in range(3))
    lease = LeaseAuthority(a_db, labkit.VirtualClock()).acquire("job", "A", ttl=10)
    got = {}
    # B stops after winning the counter, before writing its lease
    paused, go = pause_after(b_db, lambda sql: "generation = generation + 1" in sql)

    def acquire():
        got["B"] = LeaseAuthority(b_db, labkit.VirtualClock(10)).try_acquire("job", "B", ttl=10)

    def renew():
        try:
            got["A"] = LeaseAuthority(a_db, labkit.VirtualClock(9.9)).renew(lease)
        except labkit.LeaseLost as exc:
            got["A"] = exc

    race(acquire, renew, paused=paused, go=go, waiter=a_db, observer=observer)
    assert isinstance(got["A"], labkit.LeaseLost) and got["B"].generation == 2
    assert LeaseAuthority(observer, labkit.VirtualClock(10)).current("job") == got["B"]
    for db in (a_db, b_db, observer):
        db.conn.close()


def test_a_deadlock_between_two_guards_is_busy_for_one_and_the_other_commits(pg_schema):
    """A holds fence X and wants Y, B holds Y and wants X: PostgreSQL breaks the deadlock, the
    loser gets Busy (retry) with nothing written, the winner commits."""
    import threading

    dbs = [labkit.connect(pg_schema.url) for _ in range(2)]
    for job in ("X", "Y"):
        Fence(dbs[0], job)
    both_in, outcome = threading.Barrier(2), {}

    def writer(db, mine, other):
        try:
            with Fence(db, mine).guard(1) as tx:
                both_in.wait(10)
                tx.execute("UPDATE job_fence SET generation = generation WHERE job_id = $1", (other,))
            outcome[mine] = "committed"
        except labkit.Busy:
            outcome[mine] = "busy"
    threads = [threading.Thread(target=writer, args=(dbs[0], "X", "Y")),
               threading.Thread(target=writer, args=(dbs[1], "Y", "X"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcome.values()) == ["busy", "committed"]
    fences = dict(execute(dbs[0], "SELECT job_id, generation FROM job_fence"))
    assert sorted(fences.values()) == [0, 1]  # the loser's guard rolled back
    for db in dbs:
        db.conn.close()
