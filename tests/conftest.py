"""Tiny shared fixtures: a virtual clock, labkit databases on temp files, a lease authority.

In the contract modules (``engines.CONTRACT``), ``db``, ``dump``, ``reopen`` and ``bare`` run on
SQLite and on PostgreSQL (see ``tests/engines.py``).
"""

from __future__ import annotations

import signal
import sqlite3

import pytest

import labkit

import engines


# The interrupt tests send SIGINT to a child as Ctrl-C in a terminal would. A suite started in
# the background (`make test &`, nohup) inherits SIGINT ignored, and so would every child, which
# then never sees the interrupt: give this process Python's handler, so children start at the
# default disposition (exec resets a handled signal, never an ignored one).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_generate_tests(metafunc):
    engines.parametrize(metafunc)


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the run's first process: a fresh ledger
        from answers import ATTACKS

        ATTACKS.unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter, config):
    """Each attack class of issue 22: the wrappers tried, and what each scored beside the bare
    answer (the sum over its tasks' wrong answers), as the tests noted them."""
    from answers import ATTACKS

    if hasattr(config, "workerinput") or not ATTACKS.exists():
        return
    import collections
    import contextlib
    import json

    rows = []
    for line in ATTACKS.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line a killed worker left half written
            rows.append(json.loads(line))
    table = collections.defaultdict(lambda: collections.defaultdict(list))
    for row in rows:
        table[row["kind"]][row["how"]].append(row)
    write = terminalreporter.write_line
    write(f"attacks on the grader: {len(rows)} wrapped wrong answers, each beside its bare answer")
    for kind, hows in table.items():
        write(f"  {kind}")
        for how, found in hows.items():
            tasks = ", ".join(sorted({r["task"] for r in found}))
            bare, wrapped = (round(sum(r[k] for r in found), 2) for k in ("bare", "wrapped"))
            more = sum(r["wrapped"] > r["bare"] for r in found)
            write(f"    {how} ({tasks}; {len(found)} answers): bare {bare}, wrapped {wrapped}, {more} scored more")


@pytest.fixture
def engine(request) -> str:
    """The database under test: "sqlite", or "postgres" in the contract modules' second run."""
    return getattr(request, "param", "sqlite")


@pytest.fixture(scope="session")
def pg_server():
    """One throwaway PostgreSQL for the session (skips loudly without the binaries)."""
    engines.require_postgres()
    import psycopg

    from labkit.engines.postgres import PostgresServer

    with PostgresServer(settings=engines.FAST) as server:
        with psycopg.connect(server.url, autocommit=True) as admin:
            server.admin = admin
            yield server


@pytest.fixture
def pg_schema(pg_server):
    """A fresh schema on the session's server, dropped after the test."""
    schema = engines.Schema(pg_server, pg_server.admin)
    yield schema
    schema.drop()


@pytest.fixture
def target(engine, db_path, request) -> str:
    """What ``labkit.connect`` opens for this test: the SQLite path, or the PostgreSQL URL."""
    return request.getfixturevalue("pg_schema").url if engine == "postgres" else db_path


@pytest.fixture
def clock() -> labkit.VirtualClock:
    """A VirtualClock at t=0."""
    return labkit.VirtualClock()


@pytest.fixture
def db_path(tmp_path):
    """The path of a fresh SQLite file (not created yet)."""
    return str(tmp_path / "lab.db")


@pytest.fixture
def db(target):
    """``labkit.connect`` on a temp file (WAL, labkit's schema), or PostgreSQL; closed afterwards."""
    database = labkit.connect(target, busy_timeout_ms=2000)
    yield database
    database.conn.close()


@pytest.fixture
def reopen(target):
    """Open another labkit connection to the same database; all closed afterwards."""
    opened = []

    def open_(**options):
        opened.append(labkit.connect(target, **options))
        return opened[-1]
    yield open_
    for database in opened:
        database.conn.close()


@pytest.fixture
def bare(engine, target, request):
    """A writer who never heard of labkit: ``bare(sql, params)`` on the driver itself (``$1``
    placeholders, bound by position: psycopg's raw cursor, or SQLite's names 1, 2, ...),
    autocommit; ``bare.Error`` is the driver's error class."""
    if engine == "postgres":
        import psycopg

        conn = psycopg.connect(target, autocommit=True, cursor_factory=psycopg.RawCursor)
        run, error = conn.execute, psycopg.Error
    else:
        conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
        run = lambda sql, params=(): conn.execute(sql, {str(i): v for i, v in enumerate(params, 1)})  # noqa: E731
        error = sqlite3.Error
    writer = type("Bare", (), {"__call__": staticmethod(run), "Error": error, "conn": conn})()
    yield writer
    conn.close()


@pytest.fixture
def files(tmp_path):
    """Open labkit databases on fresh files under tmp_path by short name; all closed afterwards."""
    opened = []

    def open_(name):
        db = labkit.connect(str(tmp_path / f"{name}.db"))
        opened.append(db)
        return db
    yield open_
    for db in opened:
        db.conn.close()


@pytest.fixture
def leases(db, clock) -> labkit.LeaseAuthority:
    """A LeaseAuthority on ``db`` reading ``clock``."""
    return labkit.LeaseAuthority(db, clock)


def dump(path: str) -> list[str]:
    """The whole database at ``path`` as SQL, read through a separate plain connection."""
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.fixture(name="dump")
def dump_fixture(engine, db_path, request):
    """A function returning the dump of the test's database now: compare before and after."""
    if engine == "postgres":
        return request.getfixturevalue("pg_schema").dump
    return lambda: dump(db_path)
