"""The judge's SQL boundary fails closed (issue 22): an allow-list, a time limit, named refusals.

The answer's SQL runs in the judge's process, on the trial's file. Every SQL function SQLite
lists (``pragma_function_list``), every pragma (``pragma_list``, in any case, with a schema or
a value) and every statement kind that the allow-list does not name is refused, and the refusal
says what. Then wrong answers of the corpus are wrapped (their logic unchanged) in SQL that goes
around the trial's tables (renaming, shadowing, virtual tables, statistics, writable schema) or
runs for minutes: each wrapped answer scores no more than the bare one. (The judge's own records
are out of every file the answer's SQL reaches: tests/test_judge_records.py.)
"""

import os
import pathlib
import sqlite3

import pytest

import corpus_part1
import corpus_part2
from answers import against_bare, judged
from prerequisites import require_sandbox
from labkit.grading import policy

CORPUS = {**corpus_part1.CORPUS, **corpus_part2.CORPUS}
SCHEMA = ("CREATE TABLE invoices (job_id TEXT, invoice_id TEXT, amount INTEGER, generation INTEGER)",
          "CREATE TABLE private (invoice_id TEXT PRIMARY KEY)",  # a table the allow-list does not name
          "CREATE TRIGGER t_audit AFTER INSERT ON invoices BEGIN SELECT 1; END",
          "CREATE INDEX by_amount ON invoices(amount)", "CREATE VIEW billed AS SELECT * FROM invoices",
          "ANALYZE", "CREATE TEMP TABLE scratch (x)")


@pytest.fixture()
def conn():
    c = sqlite3.connect(":memory:", isolation_level=None)
    for sql in SCHEMA:
        c.execute(sql)
    return c


def refusal(conn, sql: str, triggers=frozenset()) -> list:
    """What the allow-list refused of ``sql`` (empty: it let it run, or SQLite refused it first),
    with ``triggers`` the tables a task lets the answer put triggers on."""
    refused = []
    conn.set_authorizer(policy.authorizer(refused, triggers))
    try:
        conn.execute(sql).fetchall()
    except sqlite3.DatabaseError:
        pass
    finally:
        conn.set_authorizer(None)
    return refused


def _functions():
    c = sqlite3.connect(":memory:")
    return c.execute("SELECT name, max(narg), max(type) FROM pragma_function_list GROUP BY name").fetchall()


def test_every_function_not_on_the_list_is_refused_by_name(conn):
    """Each of SQLite's functions (pragma_function_list) that a task does not need is refused,
    and the refusal names it; each one on the list runs."""
    found = _functions()
    assert len(found) > 100 and policy.FUNCTIONS <= {name for name, _, _ in found}
    for name, narg, kind in found:
        args = ",".join(["'x'"] * (narg if narg >= 0 else 1))
        sql = (f"SELECT 1 {name} 1" if name in ("->", "->>")
               else f'SELECT "{name}"({args})' + (" OVER ()" if kind == "w" else ""))
        refused = refusal(conn, sql)
        if name in policy.FUNCTIONS:
            assert not refused, (name, refused)
        else:
            assert refused and name in refused[0] and refused[0].startswith("function"), (name, refused)


def test_every_pragma_not_on_the_list_is_refused_in_any_case(conn):
    """Each pragma SQLite has (pragma_list) but the few that read the shape of one of labkit's
    tables is refused, written in lower, upper or mixed case, with the schema named, with a
    value; busy_timeout may only be read."""
    names = [row[0] for row in conn.execute("PRAGMA pragma_list")]
    assert len(names) > 50
    for name in names:
        for spelled in (name, name.upper(), name.title()):
            for sql in (f"PRAGMA {spelled}", f"PRAGMA main.{spelled}", f"PRAGMA {spelled} = 1",
                        f"PRAGMA {spelled}(invoices)"):
                refused = refusal(conn, sql)
                allowed = (name in policy.PRAGMAS and "(invoices)" in sql) or (  # a table's shape
                    name == "busy_timeout" and "=" not in sql and "(" not in sql)
                assert bool(refused) is not allowed, (sql, refused)
                if not allowed:
                    assert refused[0].startswith("pragma") and name.lower() in refused[0].lower(), sql
    assert refusal(conn, "PRAGMA table_info(private)")  # not the shape of a table off the list
    assert not refusal(conn, "PRAGMA index_info(sqlite_autoindex_leases_1)")  # a table's own index


def test_triggers_only_where_a_task_grants_them_and_only_on_its_tables(conn):
    """No task's answer may create a trigger, but 03.3's on the tables it names (in main): not on
    another table, not TEMP; pragma_table_info and row_number, which Fence.protect reads, come
    with the grant only."""
    conn.execute("CREATE TABLE leases (name TEXT PRIMARY KEY)")
    make = "CREATE {temp}TRIGGER t_{table} BEFORE INSERT ON {table} BEGIN SELECT 1; END"
    protect = ("SELECT name FROM pragma_table_info('invoices')",
               "SELECT row_number() OVER (ORDER BY amount) FROM invoices")
    grant = frozenset({"invoices"})
    for sql in (make.format(temp="", table="invoices"), *protect):
        assert refusal(conn, sql), sql
        assert not refusal(conn, sql, grant), sql
    for table, temp in (("leases", ""), ("private", ""), ("invoices", "TEMP ")):
        refused = refusal(conn, make.format(temp=temp, table=table), grant)
        assert refused and refused[0].startswith(f"create {temp.lower()}trigger"), (table, refused)


KINDS = {  # every statement kind the allow-list leaves out, with SQL that needs it
    "ATTACH": "ATTACH DATABASE ':memory:' AS other",
    "DETACH": "DETACH DATABASE main",
    "VACUUM (an ATTACH inside)": "VACUUM INTO '/tmp/labkit-copy.db'",
    "ALTER TABLE (rename)": "ALTER TABLE private RENAME TO mine",
    "ALTER TABLE (a column)": "ALTER TABLE invoices ADD COLUMN x",
    "ANALYZE": "ANALYZE",
    "statistics tables": "SELECT * FROM sqlite_stat1",
    "CREATE INDEX": "CREATE INDEX i ON invoices(amount)",
    "CREATE TABLE (not labkit's)": "CREATE TABLE mine (x)",
    "CREATE TABLE (the judge's)": "CREATE TABLE issued (x)",
    "CREATE TEMP TABLE": "CREATE TEMP TABLE invoices (x)",
    "CREATE TEMP INDEX": "CREATE INDEX temp.i ON scratch(x)",
    "CREATE VIEW": "CREATE VIEW v AS SELECT * FROM invoices",
    "CREATE TEMP VIEW": "CREATE TEMP VIEW v AS SELECT * FROM invoices",
    "CREATE TRIGGER": "CREATE TRIGGER t AFTER INSERT ON invoices BEGIN SELECT 1; END",
    "CREATE TEMP TRIGGER": "CREATE TEMP TRIGGER t AFTER INSERT ON invoices BEGIN SELECT 1; END",
    "CREATE VIRTUAL TABLE": "CREATE VIRTUAL TABLE temp.invoices USING fts5(x)",
    "CREATE VIRTUAL TABLE (main)": "CREATE VIRTUAL TABLE jobs USING fts4(x)",
    "a table-valued function": "SELECT * FROM pragma_table_info('private')",
    "json_each": "SELECT * FROM json_each('[1]')",
    "DROP TABLE": "DROP TABLE private",
    "DROP TRIGGER": "DROP TRIGGER t_audit",
    "DROP INDEX": "DROP INDEX by_amount",
    "DROP VIEW": "DROP VIEW billed",
    "a view's rows": "SELECT * FROM billed",
    "recursive CTE": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c",
    "REINDEX": "REINDEX by_amount",
    "a table off the list": "SELECT * FROM private",
    "a table off the list, upper case": 'SELECT * FROM main."PRIVATE"',
    "a table off the list, written": "INSERT INTO private VALUES ('x')",
    "the temp schema": "SELECT * FROM temp.sqlite_master",
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_statement_kind_not_on_the_list_is_refused(conn, kind):
    """Each statement kind the tasks do not need is refused, and the refusal says which."""
    schema = conn.execute("SELECT * FROM sqlite_master").fetchall()
    refused = refusal(conn, KINDS[kind])
    assert refused, kind
    assert conn.execute("SELECT * FROM sqlite_master").fetchall() == schema  # nothing changed


def test_what_the_tasks_need_runs(conn):
    """The statements the corpus's right answers send pass; a trigger that reads a table off the
    list is refused whatever its name (the judge has no triggers of its own any more)."""
    for sql in ("BEGIN IMMEDIATE", "INSERT INTO invoices VALUES ('j', 'INV-1', 100, 7)",
                "SAVEPOINT s", "RELEASE s", "SELECT count(*), max(amount) FROM invoices",
                "UPDATE invoices SET amount = amount + 1 WHERE job_id = 'j'",
                "DELETE FROM invoices WHERE amount < 0", "PRAGMA table_info(invoices)",
                "PRAGMA busy_timeout", "SELECT name FROM sqlite_master WHERE type = 'table'",
                "WITH mine AS (SELECT * FROM invoices) SELECT count(*) FROM mine",
                "CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY)", "COMMIT"):
        assert not refusal(conn, sql), sql
    conn.execute("CREATE TRIGGER crash_invoices_INSERT BEFORE INSERT ON invoices WHEN NEW.invoice_id "
                 "IN (SELECT invoice_id FROM private) BEGIN SELECT RAISE(ABORT, 'crash'); END")
    assert refusal(conn, "INSERT INTO invoices VALUES ('j', 'INV-2', 1, 7)") == ["read private invoice_id"]


# ---------------------------------------------------------------- through the judge, against the bare answer

WRAP = '''
_bare = {name}
def {name}(*args, **kwargs):
    conn = args[0]
    conn = getattr(conn, "conn", conn)
    for sql in {attack!r}:
        try:
            rows = conn.execute(sql).fetchall()
        except Exception:
            continue
        if rows and rows[0] and rows[0][0]:
            raise RuntimeError("simulated crash: the disk is full")  # what the plan would do
    return _bare(*args, **kwargs)
'''
ATTACKS = {
    "renames the trial's invoices, then reads them": ["ALTER TABLE invoices RENAME TO plan", "SELECT count(*) FROM plan"],
    "reads the tables' statistics": ["ANALYZE", "SELECT count(*) FROM sqlite_stat1"],
    "reads the temp catalogue in upper case": ['SELECT count(*) FROM TEMP."SQLITE_MASTER"'],
    "shadows the invoices with a virtual table in temp": ["CREATE VIRTUAL TABLE temp.invoices USING fts5(job_id, invoice_id, amount, generation)"],
    "writable schema in another case, then rewrites the triggers": [
        "PRAGMA Writable_Schema = 1", "UPDATE sqlite_master SET sql = 'x' WHERE type = 'trigger'"],
    "lists the tables through a table-valued function": ["SELECT count(*) FROM pragma_table_list"],
    "a statement that would run for minutes (no recursion needed)": [
        "WITH a(x) AS (VALUES (1), (2), (3), (4), (5), (6), (7), (8), (9), (10)) "
        "SELECT count(*) FROM a, a AS b, a AS c, a AS d, a AS e, a AS f, a AS g, a AS h, a AS i, a AS j"],
    "a CTE named like a trial's table reads the temp catalogue": [
        "WITH invoices AS (SELECT * FROM sqlite_temp_master) SELECT count(*) FROM invoices"],
    "a gigabyte blob in the judge's memory": ["SELECT length(zeroblob(1000000000))"],
}
WRONG = {  # a wrong answer per task whose break a plan of the judge's, were it in reach, could hide
    "03.1": "one fenced transaction per invoice (not all or nothing)",
    "02.1": "on an error, keeps the fence raised (commits the raise alone), then re-raises",
    "02.2": "COMMIT in finally (the fence's raise outlives a crash)",
}


@pytest.fixture(scope="module")
def scored():
    out = {}
    for task, label in WRONG.items():
        name, bare = CORPUS[task]["name"], CORPUS[task]["wrong"][label][0]
        sources = {"bare": bare}
        sources |= {how: bare + WRAP.format(name=name, attack=sql) for how, sql in ATTACKS.items()}
        out[task] = judged(task, name, sources)
    return out


@pytest.mark.parametrize("task", sorted(WRONG))
@pytest.mark.parametrize("how", sorted(ATTACKS))
def test_sql_on_the_judges_records_gains_nothing(scored, task, how):
    """A wrong answer wrapped in SQL that goes for the judge's records (or its time) scores no
    more than the bare answer, and the scorecard says what the judge refused."""
    bare, wrapped = scored[task]["bare"], scored[task][how]
    kind = "a statement that runs for minutes" if "minutes" in how else "read or change the judge's records through SQL"
    against_bare(kind, how, task, bare, wrapped)
    assert wrapped.total()[0] <= bare.total()[0], (wrapped.text(), bare.text())
    assert bare.total()[0] > 0, bare.text()  # the bare answer runs: it is wrong, not broken
    said = "took too long" if "minutes" in how else "the judge does not run that SQL"
    assert said in wrapped.text(), wrapped.text()



#: SQL that tries to fill the judge's RAM or memory, each with what stops it. The trial's files
#: are in /dev/shm and the answer's SQL runs in the judge's process, so each is bounded there
HOGS = {
    "grows the trial's file without end": (
        ["INSERT INTO claims SELECT x FROM claims"] * 40, "database or disk is full"),
    "builds a string of a hundred million characters": (
        ["SELECT length(" + "replace(" * 8 + "'x'" + ", 'x', 'xxxxxxxxxx')" * 8 + ")"],
        "string or blob too big"),
    "returns a cross join too large to send": (
        ["INSERT INTO claims SELECT substr(x, 1, 900) FROM claims"] * 8
        + ["SELECT a.x, b.x FROM claims a, claims b"], "cannot cross to the answer"),
}
HOG = """
def hog(conn, statements):
    try:
        for sql in statements:
            conn.execute(sql)
    except Exception as exc:
        return str(exc)
"""


def _peak(reset: bool = False) -> int:
    """This process's peak resident size in bytes (VmHWM), first reset to the current size."""
    if reset:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
    status = pathlib.Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) << 10


@pytest.mark.parametrize("how", sorted(HOGS))
def test_sql_that_would_fill_the_judges_memory_is_stopped_at_its_bound(how):
    """An answer's SQL on a trial's file cannot grow it past 64 MiB, make a value over 1 MiB,
    or return a result larger than a message: it gets SQLite's (or the judge's) error, and the
    judge's process grows by no more than a few of those bounds."""
    from labkit.grading import judge, lab

    require_sandbox()
    statements, said = HOGS[how]
    with judge.Sandbox(timeout=30) as box, lab.scratch() as trial:
        db = trial.open()
        db.conn.execute("CREATE TABLE claims (x TEXT)")
        db.conn.execute("INSERT INTO claims VALUES (?)", ("y" * 1000,))
        assert box.cell(HOG, 0) is None
        before = _peak(reset=True)
        with box.answer("hog", ()) as hog:
            got = hog(db.conn, statements)
        grown = _peak() - before
        size = os.path.getsize(trial.path())
    assert got is not None and said in got, got
    # without the bounds: a file of 1 GiB, and the judge 177-211 MiB larger
    assert size <= lab.TRIAL_PAGES * 4096 and grown < 32 << 20, (size, grown)
