"""The seam between the core and PostgreSQL: one explicit interface, one round trip a statement.

Before this seam a fenced write took 8 round trips on PostgreSQL (BEGIN, a SAVEPOINT, the
guard's UPDATE and its RELEASE, the same three for the INSERT, COMMIT); now it takes 4: the
savepoint that keeps SQLite's rule (a failed statement undoes only itself) rides in the same
pipeline as its statement.
"""

import pytest

import labkit
from labkit import Fence, LabkitError
from labkit.db import Engine, check_db, execute, transaction


@pytest.fixture
def pg(pg_schema):
    db = labkit.connect(pg_schema.url)
    yield db
    db.conn.close()


def test_a_fenced_write_is_four_round_trips(pg):
    """BEGIN, the guard's UPDATE, the INSERT, COMMIT: each one round trip, counted by the engine."""
    fence = Fence(pg, "job")
    for generation in (1, 2, 2):
        before = pg.trips
        with fence.guard(generation) as tx:
            tx.execute("INSERT INTO invoices VALUES ('job', $1, 1, $2)", (f"I{pg.trips}", generation))
        assert pg.trips - before == 4
    assert fence.current() == 2 and len(execute(pg, "SELECT * FROM invoices")) == 3


def test_a_failed_statement_still_undoes_only_itself(pg):
    """As on SQLite: a duplicate key inside a transaction raises, and the transaction goes on."""
    with transaction(pg):
        execute(pg, "INSERT INTO invoices VALUES ('job', 'I1', 1, 1)")
        with pytest.raises(LabkitError, match="duplicate key"):
            execute(pg, "INSERT INTO invoices VALUES ('job', 'I1', 2, 1)")
        execute(pg, "INSERT INTO invoices VALUES ('job', 'I2', 3, 1)")
    assert execute(pg, "SELECT invoice_id, amount FROM invoices ORDER BY 1") == [("I1", 1), ("I2", 3)]


def test_the_engine_is_an_explicit_interface(pg):
    """The PostgreSQL handle is an Engine; something that merely looks like one is refused."""
    assert isinstance(pg, Engine) and check_db(pg) is pg

    class LooksLikeOne:
        isolation_level = None
        labkit_engine = "postgresql"

        def execute(self, sql, params=()):
            return []

    with pytest.raises(labkit.BadArgumentType, match="db"):
        check_db(LooksLikeOne())


def test_statements_reach_the_server_as_written(pg):
    """Nothing rewrites a statement: ``:name``, ``?`` and ``%`` inside ``$tag$ ... $tag$`` bodies
    and quotes are PostgreSQL's text, ``$1`` is its placeholder; SQLite's ``?`` is refused with
    an error that names ``$1``, and a mapping (PostgreSQL has no named parameters) names params."""
    sql = "SELECT $q$ :b ? % $q$, '?', $1::text, $$ $1 $$, $2::int"
    assert execute(pg, sql, ("a", 7)) == [(" :b ? % ", "?", "a", " $1 ", 7)]
    with pytest.raises(labkit.BadArgument, match=r"sql: .*\$1, \$2") as refused:
        execute(pg, "SELECT ?::int", (1,))
    assert "?" in str(refused.value)
    with pytest.raises(labkit.BadArgument, match="params: .*by position"):
        execute(pg, "SELECT $1::int", {"1": 1})
