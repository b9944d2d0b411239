"""Hostile input: every public entry point of labkit's core, fed bad values and bad databases.

Each case asserts the LabkitError subclass, that the message names the argument
(for bad arguments), and that the database file is unchanged (a full dump
before and after, read through a separate connection). The core's cases run on
SQLite and on PostgreSQL; the mechanisms' cases (lessons 04-08) on SQLite only.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import pytest

import labkit
from labkit import (BadArgument, BadArgumentType, Busy, Fence, LabkitError, Lease,
                    LeaseAuthority, Tx, VirtualClock, run_once)
from labkit.db import execute, quote, rowcount, transaction
from labkit.mechanisms.effects import FencedFileStore, Outbox, PaymentProvider
from labkit.mechanisms.issuers import cleanup_expired, naive_cleanup
from labkit.mechanisms.recovery import Claims, produce
from labkit.mechanisms.timing import VersionLease

from conftest import dump
from engines import ENGINES

V, T = BadArgument, BadArgumentType
NAN, INF = math.nan, math.inf
SQLISH = "x'); DROP TABLE invoices;--"


@dataclass(frozen=True)
class Case:
    """One hostile call: ``call(env)`` must raise ``error`` naming ``argument``."""

    id: str
    call: Callable[[Any], Any]
    error: type
    argument: str | None


class BrokenClock:
    """A clock whose now() answers whatever it was given."""

    def __init__(self, value):
        self.value = value

    def now(self):
        return self.value


@pytest.fixture
def env(tmp_path, engine, target, request):
    """A database with state worth protecting: a held lease, a fence at 8, an invoice, a key, and
    on SQLite a claimed job, a version lease, an outbox intent and a provider's charge."""
    path = target  # the SQLite file, or the PostgreSQL URL
    db = labkit.connect(path, busy_timeout_ms=2000)
    clock = VirtualClock(start=5)
    leases = LeaseAuthority(db, clock)
    lease = leases.acquire("job", "A", ttl=10)
    fence = Fence(db, "job")
    with fence.guard(8) as tx:
        tx.execute("INSERT INTO invoices VALUES ('job', 'INV-1', 120, 8)")
        run_once(tx, "charge/INV-1", lambda t: "charged", payload={"amount": 120})
    state = SimpleNamespace(path=path, db=db, clock=clock, leases=leases, lease=lease, fence=fence,
                            tmp=tmp_path, engine=engine, dump=request.getfixturevalue("dump"))
    if engine == "postgres":
        yield state
        db.conn.close()
        return
    claims, versions = Claims(db, clock), VersionLease(db, clock)
    claims.enqueue("job")
    claim = claims.claim("job", "A", 8)
    versions.claim(versions.observe("job"), "A", duration=10)
    files, outbox, pay = FencedFileStore(db, tmp_path / "files", "job"), Outbox(db, clock), PaymentProvider(db, clock)
    with fence.guard(8) as tx:
        outbox.add(tx, "job/email", "email", {"to": "ops"})
    pay.charge("acct-1", 120, idempotency_key="charge/INV-1")
    state.__dict__.update(claims=claims, claim=claim, versions=versions, files=files, outbox=outbox,
                          pay=pay)
    yield state
    db.conn.close()


# --- the table of bad arguments ------------------------------------------------------------

BAD_NAMES = [(1, T), (None, T), (b"job", T), (["job"], T), ("", V), ("a\x00b", V)]
BAD_SECONDS = [(-1, V), (-0.5, V), (NAN, V), (INF, V), (-INF, V), (10 ** 400, V), (-10 ** 400, V),
               (True, T), (False, T), ("10", T), (None, T), (1j, T)]
BAD_TTLS = [(0, V), (0.0, V)] + BAD_SECONDS
BAD_TOKENS = [(True, T), (False, T), (1.0, T), (8.0, T), (NAN, T), (INF, T), (-1, V), (2 ** 63, V),
              (2 ** 64, V), (-2 ** 63, V), ("8", T), (None, T), ({"epoch": 1}, T), ((1,), V),
              ((1, 2, 3), V), ((), V), ((True, 1), T), ((1, False), T), ((1, -1), V),
              ((2 ** 63, 0), V), ((0, 2 ** 63), V), ((1, 2.0), T), ((NAN, 1), T), (("1", "2"), T)]
BAD_TIMEOUTS = [(-1, V), (2 ** 31, V), (2 ** 63, V), (1.5, T), (True, T), (NAN, T), (INF, T),
                ("5", T), (None, T)]
BAD_PAYLOADS = [NAN, INF, -INF, object(), {1, 2}, b"bytes", {"k": NAN}, {1: "a", "b": 2}]


def cases() -> list[Case]:
    """Every bad-argument case, generated from the tables above."""
    out = []

    def add(id, call, bad):
        value, error = bad
        shown = re.sub(r" at 0x[0-9a-f]+", "", repr(value))  # the same id in every process
        out.append(Case(f"{id}={shown}"[:70], call, error, id.split(".")[-1].split("(")[0]))

    for bad in BAD_NAMES:
        v = bad[0]
        add("connect.path", lambda e, v=v: labkit.connect(v), bad)
        add("acquire.name", lambda e, v=v: e.leases.acquire(v, "B", 10), bad)
        add("acquire.owner", lambda e, v=v: e.leases.acquire("other", v, 10), bad)
        add("try_acquire.name", lambda e, v=v: e.leases.try_acquire(v, "B", 10), bad)
        add("try_acquire.owner", lambda e, v=v: e.leases.try_acquire("other", v, 10), bad)
        add("current.name", lambda e, v=v: e.leases.current(v), bad)
        add("Lease.name", lambda e, v=v: Lease(v, "A", 1, 15.0, 10.0), bad)
        add("Lease.owner", lambda e, v=v: Lease("job", v, 1, 15.0, 10.0), bad)
        add("Fence.job", lambda e, v=v: Fence(e.db, v), bad)
        add("protect.table", lambda e, v=v: e.fence.protect(v), bad)
        add("protect.column", lambda e, v=v: e.fence.protect("invoices", v), bad)
        add("run_once.key", lambda e, v=v: run_once(e.db, v, lambda tx: 1), bad)
        add("quote.identifier", lambda e, v=v: quote(v), bad)
    for bad in BAD_TIMEOUTS:
        v = bad[0]
        add("connect.busy_timeout_ms", lambda e, v=v: labkit.connect(e.path, busy_timeout_ms=v), bad)
    for bad in BAD_SECONDS:
        v = bad[0]
        add("VirtualClock.start", lambda e, v=v: VirtualClock(start=v), bad)
        add("advance.seconds", lambda e, v=v: e.clock.advance(v), bad)
    for bad in BAD_TTLS:
        v = bad[0]
        add("acquire.ttl", lambda e, v=v: e.leases.acquire("other", "B", v), bad)
        add("try_acquire.ttl", lambda e, v=v: e.leases.try_acquire("other", "B", v), bad)
        add("Lease.ttl", lambda e, v=v: Lease("job", "A", 1, 15.0, v), bad)
    for bad in BAD_TOKENS:
        v = bad[0]
        add("guard.generation", lambda e, v=v: e.fence.guard(v).__enter__(), bad)
        if not isinstance(v, tuple):
            add("Lease.generation", lambda e, v=v: Lease("job", "A", v, 15.0, 10.0), bad)
    for v, error in [(NAN, V), (INF, V), (-INF, V), ("15", T), (None, T), (True, T)]:
        add("Lease.expires_at", lambda e, v=v: Lease("job", "A", 1, v, 10.0), (v, error))
    for v in ("db", None, 42, sqlite3):
        add("LeaseAuthority.db", lambda e, v=v: LeaseAuthority(v, e.clock), (v, T))
        add("Fence.db", lambda e, v=v: Fence(v, "job"), (v, T))
        add("run_once.db_or_tx", lambda e, v=v: run_once(v, "k", lambda tx: 1), (v, T))
        add("execute.db", lambda e, v=v: execute(v, "SELECT 1"), (v, T))
        add("Tx.conn", lambda e, v=v: Tx(v, (0, 1)), (v, T))
    for v in (None, "clock", object(), VirtualClock.now):
        add("LeaseAuthority.clock", lambda e, v=v: LeaseAuthority(e.db, v), (v, T))
    for v in (NAN, INF, None, True, "5"):
        add("acquire(clock).clock", lambda e, v=v: LeaseAuthority(e.db, BrokenClock(v)).acquire("o", "B", 1),
            (v, V))
        add("renew(clock).clock", lambda e, v=v: LeaseAuthority(e.db, BrokenClock(v)).renew(e.lease), (v, V))
        add("current(clock).clock", lambda e, v=v: LeaseAuthority(e.db, BrokenClock(v)).current("job"), (v, V))
    for v in ("job", None, {"name": "job"}, ("job", "A", 1, 15.0, 10.0)):
        add("renew.lease", lambda e, v=v: e.leases.renew(v), (v, T))
        add("release.lease", lambda e, v=v: e.leases.release(v), (v, T))
    add("acquire(huge now).ttl", lambda e: LeaseAuthority(e.db, VirtualClock(1e308)).acquire("o", "B", 1e308),
        (1e308, V))
    add("renew(huge now).lease", lambda e: LeaseAuthority(e.db, VirtualClock(1e308)).renew(
        Lease("job", "A", 1, 15.0, 1e308)), (1e308, V))
    add("advance(overflow).seconds", lambda e: VirtualClock(1e308).advance(1e308), (1e308, V))
    for v in (None, 1, "print", [lambda tx: 1]):
        add("run_once.effect", lambda e, v=v: run_once(e.db, "k", v), (v, T))
    for v in BAD_PAYLOADS:
        add("run_once.payload", lambda e, v=v: run_once(e.db, "k", lambda tx: 1, payload=v), (v, V))
    for v in (NAN, object(), {1, 2}):
        add("run_once(result).effect", lambda e, v=v: run_once(e.db, "k2", lambda tx: v), (v, V))
    for v, error in [(1, T), (None, T), (b"SELECT 1", T), ("SELECT 1; DELETE FROM invoices", V)]:
        add("Tx.execute.sql", lambda e, v=v: guarded(e, lambda tx: tx.execute(v)), (v, error))
        add("execute.sql", lambda e, v=v: execute(e.db, v), (v, error))
        add("rowcount.sql", lambda e, v=v: rowcount(e.db, v), (v, error))
    for v in (5, ([1],), (2 ** 63,), (-2 ** 63 - 1,), (object(),), (), (1, 2), {"other": 1}):
        add("Tx.execute.params", lambda e, v=v: guarded(e, lambda tx: tx.execute(
            "UPDATE invoices SET amount = $1", v)), (v, V))
        add("execute.params", lambda e, v=v: execute(e.db, "UPDATE invoices SET amount = $1", v), (v, V))
    for v in (5, None, (0,), "08"):
        add("Tx.token", lambda e, v=v: Tx(e.db.conn, v), (v, T))
    for v in (None, "A", 1, ("job", "A", 1)):
        add("heartbeat.mine", lambda e, v=v: e.versions.heartbeat(v), (v, T))
        add("release(version).mine", lambda e, v=v: e.versions.release(v), (v, T))
        add("produce.fence", lambda e, v=v: produce(v, e.claim, "c1", 100), (v, T))
        add("produce.claim", lambda e, v=v: produce(e.fence, v, "c1", 100), (v, T))
        add("cleanup_expired.clock", lambda e, v=v: cleanup_expired(e.db, v, "job"), (v, T))
        add("naive_cleanup.clock", lambda e, v=v: naive_cleanup(e.db, v, "job"), (v, T))
    for v in (None, 42, "db"):
        add("cleanup_expired.db", lambda e, v=v: cleanup_expired(v, e.clock, "job"), (v, T))
        add("naive_cleanup.db", lambda e, v=v: naive_cleanup(v, e.clock, "job"), (v, T))
    for v in (NAN, None, "5"):
        add("cleanup_expired(clock).clock", lambda e, v=v: cleanup_expired(e.db, BrokenClock(v), "job"), (v, V))
        add("mark_sent(clock).clock", lambda e, v=v: Outbox(e.db, BrokenClock(v)).mark_sent("job/email", 1),
            (v, V))
    for v, error in [(None, T), (42, T), (b"files", T), ("", V)]:
        add("FencedFileStore.directory", lambda e, v=v: FencedFileStore(e.db, v, "new-job"), (v, error))
    for bad in BAD_NAMES:
        v = bad[0]
        add("FencedFileStore.job", lambda e, v=v: FencedFileStore(e.db, e.tmp / "files", v), bad)
        add("mark_sent.key", lambda e, v=v: e.outbox.mark_sent(v, 1), bad)
        if v is not None:
            add("pending.kind", lambda e, v=v: e.outbox.pending(v), bad)
    for v, error in [(object(), T), (None, T), ("1", T), (-1, V), (2 ** 63, V)]:
        add("mark_sent.provider_id", lambda e, v=v: e.outbox.mark_sent("job/email", v), (v, error))
    for v, error in [("100", T), (1.5, T), (True, T), (None, T), (0, V), (-5, V), (2 ** 63, V)]:
        add("charge.amount", lambda e, v=v: e.pay.charge("acct-1", v), (v, error))
        if v != 0:                                          # an invoice of 0 is a legal invoice
            add("produce.amount", lambda e, v=v: produce(e.fence, e.claim, "c1", v), (v, error))
    return out


def guarded(env, body):
    """Run ``body(tx)`` inside a guard at the fence's own token (accepted, changes nothing by itself)."""
    with env.fence.guard(8) as tx:
        return body(tx)


CASES = cases()
# the mechanisms of lessons 04-08 (their schemas and SQL are SQLite's): SQLite only
MECHANISMS = ("heartbeat", "release(version)", "produce", "cleanup_expired", "naive_cleanup",
              "FencedFileStore", "pending", "mark_sent", "charge")
ON_BOTH = [(engine, case) for case in CASES for engine in ENGINES
           if engine == "sqlite" or not case.id.startswith(MECHANISMS)]


@pytest.mark.parametrize("engine, case", ON_BOTH, indirect=["engine"],
                         ids=[f"{engine}-{case.id}" for engine, case in ON_BOTH])
def test_bad_argument_raises_a_named_labkit_error_and_changes_nothing(env, case):
    """Each bad argument raises its LabkitError subclass naming the argument; the database is unchanged."""
    before = env.dump()
    with pytest.raises(case.error) as caught:
        case.call(env)
    assert isinstance(caught.value, LabkitError)
    assert caught.value.argument == case.argument
    assert case.argument in str(caught.value)
    assert env.dump() == before
    assert not env.db.conn.in_transaction


def test_a_connection_with_implicit_transactions_is_refused(env):
    """A connection not opened by labkit.connect (isolation_level != None) is refused, naming db; nothing written."""
    implicit = sqlite3.connect(env.path)
    before = dump(env.path)
    for call in (lambda: LeaseAuthority(implicit, env.clock), lambda: Fence(implicit, "job"),
                 lambda: run_once(implicit, "k", lambda tx: 1), lambda: execute(implicit, "DELETE FROM invoices")):
        with pytest.raises(BadArgument, match="isolation_level") as caught:
            call()
        assert caught.value.argument in ("db", "db_or_tx")
    assert not implicit.in_transaction
    implicit.close()
    assert dump(env.path) == before


def test_the_matrix_covers_every_public_entry_point():
    """The cases reach every public callable of the core at least once."""
    covered = {c.id.split("=")[0].split(".")[0].split("(")[0] for c in CASES}
    assert {"connect", "VirtualClock", "advance", "LeaseAuthority", "acquire", "try_acquire", "renew",
            "release", "current", "Lease", "Fence", "guard", "protect", "run_once", "Tx", "quote",
            "execute", "rowcount", "heartbeat", "produce", "cleanup_expired", "naive_cleanup",
            "FencedFileStore", "pending", "mark_sent", "charge"} <= covered
    assert len(CASES) > 250


# --- bad databases ---------------------------------------------------------------------------

WRITES = {
    "acquire": lambda db, e: LeaseAuthority(db, e.clock).acquire("other", "B", 10),
    "try_acquire": lambda db, e: LeaseAuthority(db, e.clock).try_acquire("other", "B", 10),
    "renew": lambda db, e: LeaseAuthority(db, e.clock).renew(e.lease),
    "release": lambda db, e: LeaseAuthority(db, e.clock).release(e.lease),
    "Fence(new job)": lambda db, e: Fence(db, "new-job"),
    "guard": lambda db, e: Fence(db, "job").guard(9).__enter__(),
    "protect": lambda db, e: Fence(db, "job").protect("invoices"),
    "run_once": lambda db, e: run_once(db, "new-key", lambda tx: 1),
    "execute": lambda db, e: execute(db, "DELETE FROM invoices"),
    "transaction": lambda db, e: transaction(db).__enter__(),
}
READS = {
    "current": lambda db, e: LeaseAuthority(db, e.clock).current("job"),
    "Fence(existing job)": lambda db, e: Fence(db, "job"),
    "Fence.current": lambda db, e: Fence(e.db, "job").__class__(db, "job").current(),
}


@pytest.mark.parametrize("name", sorted(WRITES) + sorted(READS))
def test_a_closed_database_is_a_bad_argument_naming_db(env, name):
    """Every call on a closed database raises BadArgument naming db; the database is unchanged."""
    closed = labkit.connect(env.path)
    closed.conn.close()
    before = env.dump()
    with pytest.raises(BadArgument, match="db: the database connection is closed") as caught:
        {**WRITES, **READS}[name](closed, env)
    assert caught.value.argument == "db"
    assert env.dump() == before


@pytest.mark.parametrize("name", sorted(set(WRITES) - {"transaction"}))  # BEGIN itself writes nothing
def test_a_read_only_database_refuses_writes_naming_db(env, name):
    """Through a mode=ro URI, every write raises BadArgument naming db and leaves the file unchanged."""
    read_only = labkit.connect(f"file:{env.path}?mode=ro")
    before = dump(env.path)
    with pytest.raises(BadArgument, match="read-only") as caught:
        WRITES[name](read_only, env)
    assert caught.value.argument == "db"
    assert not read_only.conn.in_transaction
    assert dump(env.path) == before
    read_only.conn.close()


@pytest.mark.parametrize("name", sorted(READS))
def test_a_read_only_database_still_answers_reads(env, name):
    """Reads through a read-only connection work and see the writer's state."""
    read_only = labkit.connect(f"file:{env.path}?mode=ro")
    assert READS[name](read_only, env) is not None
    assert LeaseAuthority(read_only, env.clock).current("job") == env.lease
    read_only.conn.close()


LABKIT_TABLES = "lease_counter, leases, job_fence, idempotency_keys, invoices"


def lock_everything(env):
    """Another connection that blocks every write and no read: SQLite's BEGIN IMMEDIATE, or on
    PostgreSQL an EXCLUSIVE lock on each of labkit's tables. Returns its undo."""
    if env.engine == "postgres":
        import psycopg
        locker = psycopg.connect(env.path, autocommit=True)
        locker.execute("BEGIN")
        locker.execute(f"LOCK TABLE {LABKIT_TABLES} IN EXCLUSIVE MODE")
    else:
        locker = sqlite3.connect(env.path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")

    def undo():
        locker.execute("ROLLBACK")
        locker.close()
    return undo


# on PostgreSQL, BEGIN takes no lock: only a statement that writes waits
LOCKED = [("sqlite", name) for name in sorted(WRITES)]
LOCKED += [("postgres", name) for name in sorted(WRITES) if name != "transaction"]


@pytest.mark.parametrize("engine, name", LOCKED, indirect=["engine"])
def test_a_database_locked_past_the_busy_timeout_raises_busy(env, name):
    """While another connection holds the write lock, every write raises Busy after 50 ms and writes nothing."""
    impatient = labkit.connect(env.path, busy_timeout_ms=50)
    undo = lock_everything(env)
    before = env.dump()                     # readers are not blocked
    try:
        with pytest.raises(Busy) as caught:
            WRITES[name](impatient, env)
        assert caught.value.timeout_ms == 50 and "50 ms" in str(caught.value)
        assert not impatient.conn.in_transaction
    finally:
        undo()
    assert env.dump() == before
    impatient.conn.close()


def test_connect_to_a_file_that_is_not_sqlite_names_path_and_leaves_it_alone(tmp_path):
    """A text file is not a database: BadArgument naming path, and its bytes are untouched."""
    path = tmp_path / "notes.db"
    content = b"These are my lecture notes, not a database.\n" * 100
    path.write_bytes(content)
    for given in (str(path), path):
        with pytest.raises(BadArgument, match="not a SQLite database") as caught:
            labkit.connect(given)
        assert caught.value.argument == "path" and "path" in str(caught.value)
    assert path.read_bytes() == content
    assert sorted(os.listdir(tmp_path)) == ["notes.db"]


@pytest.mark.parametrize("where", ["directory", "missing folder", "read-only, no schema", "read-only, missing"])
def test_connect_to_an_unusable_path_names_path(tmp_path, where):
    """A directory, a missing folder, or a read-only file without labkit's schema: BadArgument naming path."""
    plain = tmp_path / "plain.db"
    conn = sqlite3.connect(plain)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    path = {"directory": str(tmp_path), "missing folder": str(tmp_path / "no" / "such.db"),
            "read-only, no schema": f"file:{plain}?mode=ro",
            "read-only, missing": f"file:{tmp_path / 'absent.db'}?mode=ro"}[where]
    before = dump(str(plain))
    with pytest.raises(BadArgument) as caught:
        labkit.connect(path)
    assert caught.value.argument == "path"
    assert dump(str(plain)) == before


def test_connect_waits_out_a_lock_then_raises_busy_without_installing_anything(tmp_path):
    """A fresh database locked by another writer: connect cannot install the schema and raises Busy."""
    path = str(tmp_path / "fresh.db")
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("CREATE TABLE mine (x)")
    locker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(Busy):
            labkit.connect(path, busy_timeout_ms=50)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert dump(path) == ["BEGIN TRANSACTION;", "CREATE TABLE mine (x);", "COMMIT;"]


# --- SQL-looking strings are data --------------------------------------------------------------

def test_sql_looking_names_owners_jobs_and_keys_are_stored_as_given(env):
    """A lease name, owner, fenced job and operation key like x'); DROP TABLE invoices;-- are stored verbatim."""
    lease = env.leases.acquire(SQLISH, SQLISH, ttl=10)
    assert env.leases.current(SQLISH) == lease == Lease(SQLISH, SQLISH, 1, 15.0, 10.0)
    env.leases.release(env.leases.renew(lease))
    fence = Fence(env.db, SQLISH)
    with fence.guard(3) as tx:
        assert run_once(tx, SQLISH, lambda t: SQLISH, payload=SQLISH) == SQLISH
    assert fence.current() == 3
    assert execute(env.db, "SELECT job_id FROM job_fence WHERE job_id = $1", (SQLISH,)) == [(SQLISH,)]
    assert execute(env.db, "SELECT name FROM lease_counter WHERE name = $1", (SQLISH,)) == [(SQLISH,)]
    assert execute(env.db, "SELECT key FROM idempotency_keys WHERE key = $1", (SQLISH,)) == [(SQLISH,)]
    assert execute(env.db, "SELECT invoice_id FROM invoices") == [("INV-1",)]


def test_huge_but_finite_numbers_are_accepted_where_they_make_sense(env):
    """A ttl of 2**63 seconds and the largest generation 2**63-1 are legal values, not errors."""
    lease = env.leases.acquire("long", "B", ttl=2 ** 63)
    assert lease.expires_at == 5 + 2.0 ** 63
    with env.fence.guard(2 ** 63 - 1):
        pass
    assert env.fence.current() == 2 ** 63 - 1
