"""Real processes on both databases: a holder frozen with SIGSTOP, killed with SIGKILL, thawed late.

Each worker is a separate Python process driven line by line over a pipe (a "puppet"), so the
test decides exactly where it is when it is frozen. The lock it holds is SQLite's write lock or,
on PostgreSQL, the fence row's lock.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

import labkit
from labkit import Busy, Fence, LeaseAuthority, RealClock
from labkit.db import execute
from labkit.engines.servers import proc_state
from polling import wait_for

PUPPET = r"""
import json, sys, labkit
from labkit.db import execute, transaction
ns = {"labkit": labkit, "execute": execute, "transaction": transaction}
for line in sys.stdin:
    try:
        exec(line, ns)
        print(json.dumps(["ok", repr(ns.pop("_", None))]), flush=True)
    except Exception as exc:
        print(json.dumps([type(exc).__name__, str(exc)]), flush=True)
"""


class Puppet:
    """A worker process that runs each line it is sent and answers [outcome, detail]."""

    def __init__(self, target: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", PUPPET], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        assert self.do(f"db = labkit.connect({target!r}, busy_timeout_ms=10000)")[0] == "ok"

    def do(self, line: str) -> list:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)
        if sig == signal.SIGSTOP:
            wait_for(lambda: proc_state(self.process.pid) == "T", "the worker to be frozen")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def puppets(target):
    """Start puppets on the test's database; all killed afterwards."""
    started = []

    def start():
        started.append(Puppet(target))
        return started[-1]
    yield start
    for puppet in started:
        puppet.kill()


def invoices(db):
    return execute(db, "SELECT invoice_id, amount, generation FROM invoices ORDER BY 1")


def test_a_frozen_holder_blocks_every_writer_until_killed_and_its_write_rolls_back(
        db, reopen, puppets):
    """A is frozen inside guard(1) after writing: B's guard(2) is Busy, reads still answer; once
    A is killed, B gets in and A's write is gone."""
    Fence(db, "job")
    a = puppets()
    assert a.do("g = labkit.Fence(db, 'job').guard(1); tx = g.__enter__()")[0] == "ok"
    assert a.do("tx.execute(\"INSERT INTO invoices VALUES ('job', 'INV-A', 1, 1)\")")[0] == "ok"
    a.signal(signal.SIGSTOP)
    impatient = reopen(busy_timeout_ms=100)
    with pytest.raises(Busy):
        with Fence(impatient, "job").guard(2) as tx:
            tx.execute("INSERT INTO invoices VALUES ('job', 'INV-B', 2, 2)")
    assert Fence(impatient, "job").current() == 0 and invoices(impatient) == []
    a.kill()
    patient = reopen(busy_timeout_ms=10000)
    with Fence(patient, "job").guard(2) as tx:
        tx.execute("INSERT INTO invoices VALUES ('job', 'INV-B', 2, 2)")
    assert invoices(db) == [("INV-B", 2, 2)] and Fence(db, "job").current() == 2


@pytest.mark.parametrize("protected", [True, False], ids=["fenced", "unfenced"])
def test_a_holder_thawed_after_its_lease_expired_is_refused_only_by_the_fence(
        db, reopen, puppets, protected, engine):
    """A holds a 0.3 s lease and is frozen; B acquires generation 2 and writes. Thawed, A's write
    with generation 1 overwrites B's invoice without the fence, and is refused with it."""
    fence = Fence(db, "job")
    a = puppets()
    clock = "" if engine == "postgres" else ", labkit.RealClock()"  # a server's is its own
    a.do(f"leases = labkit.LeaseAuthority(db{clock})")
    assert a.do("lease = leases.acquire('job', 'A', ttl=0.3)")[0] == "ok"
    a.signal(signal.SIGSTOP)
    leases = LeaseAuthority(reopen(), *([] if engine == "postgres" else [RealClock()]))
    b = wait_for(lambda: leases.try_acquire("job", "B", ttl=30), "A's lease to expire")
    assert b.generation == 2
    with fence.guard(b.generation) as tx:
        tx.execute("INSERT INTO invoices VALUES ('job', 'INV-1', 120, $1)", (b.generation,))
    a.signal(signal.SIGCONT)
    write = "tx.execute(\"UPDATE invoices SET amount = 100, generation = 1 WHERE invoice_id = 'INV-1'\")"
    if protected:
        outcome = a.do(f"with labkit.Fence(db, 'job').guard(lease.generation) as tx: {write}")
        assert outcome[0] == "StaleGeneration" and "generation 1" in outcome[1]
        assert invoices(db) == [("INV-1", 120, 2)]
    else:
        outcome = a.do(f"with labkit.fence.unfenced(db, lease.generation) as tx: {write}")
        assert outcome[0] == "ok"
        assert invoices(db) == [("INV-1", 100, 1)]  # B's work is lost
    assert leases.current("job") == b


def test_a_killed_worker_mid_run_once_leaves_its_key_free_for_the_retry(db, puppets):
    """A worker killed inside run_once's effect recorded nothing: the retry runs the effect once."""
    a = puppets()
    write = "tx.execute(\"INSERT INTO invoices VALUES ('job', 'INV-1', 5, 0)\")"
    effect = f"lambda tx: ({write}, print('[\"in\", \"\"]', flush=True), input())"
    assert a.do(f"labkit.run_once(db, 'charge-1', {effect})") == ["in", ""]
    a.kill()  # inside the effect, its write done, waiting for a line that never comes
    calls = []
    result = labkit.run_once(db, "charge-1", lambda tx: calls.append(1) or "charged")
    assert (result, calls, invoices(db)) == ("charged", [1], [])
