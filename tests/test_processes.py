"""Real concurrency: two connections in threads, and several OS processes on one SQLite file."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from polling import WAIT, wait_for

import labkit
from labkit.sim.history import check
from labkit.processes.team import Team, proc_state
from labkit.processes.workers import WORKING



def rows(path: str) -> list[tuple]:
    db = labkit.connect(path)
    try:
        return labkit.db.execute(db, "SELECT invoice_id, amount, generation FROM invoices ORDER BY invoice_id")
    finally:
        db.conn.close()


def test_second_guard_waits_for_the_first_then_the_fence_refuses_the_lower(db_path):
    """B's guard starts BEGIN IMMEDIATE while A's guard holds the lock and is still blocked there when A
    commits; B enters only after A's commit; A's later 7 is refused."""
    a, b = labkit.connect(db_path, busy_timeout_ms=10_000), labkit.connect(db_path, busy_timeout_ms=10_000)
    fence_a, fence_b = labkit.Fence(a, "invoices"), labkit.Fence(b, "invoices")
    order, b_begins = [], threading.Event()
    # SQLite reports a statement to the trace callback when it starts running it: once B's BEGIN
    # IMMEDIATE is reported, B is inside the call that must wait for A's lock.
    b.conn.set_trace_callback(lambda sql: b_begins.set() if sql.startswith("BEGIN IMMEDIATE") else None)

    def worker_b():
        with fence_b.guard(8) as tx:
            order.append("B inside")
            tx.execute("INSERT INTO invoices VALUES ('invoices', 'INV-2', 200, 8)")
        order.append("B committed")

    with fence_a.guard(7) as tx:
        tx.execute("INSERT INTO invoices VALUES ('invoices', 'INV-1', 100, 7)")
        thread = threading.Thread(target=worker_b)
        thread.start()
        assert b_begins.wait(WAIT), "B never reached BEGIN IMMEDIATE"
        assert thread.is_alive() and order == []          # B has begun and has not got in
        order.append("A commits")
    thread.join(WAIT)
    assert not thread.is_alive()
    assert order == ["A commits", "B inside", "B committed"]
    with pytest.raises(labkit.StaleGeneration) as refused:
        with fence_a.guard(7) as tx:
            tx.execute("INSERT INTO invoices VALUES ('invoices', 'INV-3', 300, 7)")
    assert (refused.value.offered, refused.value.current) == (7, 8)
    assert rows(db_path) == [("INV-1", 100, 7), ("INV-2", 200, 8)]
    assert fence_b.current() == 8


def test_a_guard_gives_up_with_busy_after_its_timeout_and_writes_nothing(db_path):
    """A writer whose busy timeout runs out while another holds the lock gets Busy and writes nothing."""
    a, b = labkit.connect(db_path), labkit.connect(db_path, busy_timeout_ms=100)
    fence_a, fence_b = labkit.Fence(a, "invoices"), labkit.Fence(b, "invoices")
    with fence_a.guard(7) as tx:
        tx.execute("INSERT INTO invoices VALUES ('invoices', 'INV-1', 100, 7)")
        with pytest.raises(labkit.Busy):
            with fence_b.guard(8) as tx_b:
                tx_b.execute("INSERT INTO invoices VALUES ('invoices', 'INV-2', 200, 8)")
    assert fence_b.current() == 7
    assert rows(db_path) == [("INV-1", 100, 7)]


HOLDER = """
import sys, time, labkit
db = labkit.connect(sys.argv[1])
with labkit.Fence(db, "invoices").guard(5) as tx:
    tx.execute("INSERT INTO invoices VALUES ('invoices', 'INV-9', 900, 5)")
    print("inside", flush=True)
    time.sleep(60)
"""


def test_a_frozen_holder_blocks_every_writer_and_sigkill_rolls_it_back(db_path):
    """A process frozen inside BEGIN IMMEDIATE blocks writers (Busy); SIGKILL frees the lock and undoes its writes."""
    labkit.Fence(labkit.connect(db_path), "invoices")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, db_path], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "inside"
        os.kill(holder.pid, signal.SIGSTOP)
        wait_for(lambda: proc_state(holder.pid) == "T", "the holder to stop")
        other = labkit.Fence(labkit.connect(db_path, busy_timeout_ms=100), "invoices")
        with pytest.raises(labkit.Busy):
            with other.guard(6):
                pass
        holder.kill()
        holder.wait()
        assert other.current() == 0                    # its raise to 5 was rolled back
        impatient = labkit.Fence(labkit.connect(db_path, busy_timeout_ms=0), "invoices")
        with impatient.guard(6) as tx:                 # the lock is free at once
            tx.execute("INSERT INTO invoices VALUES ('invoices', 'INV-1', 100, 6)")
        assert rows(db_path) == [("INV-1", 100, 6)]
    finally:
        holder.kill()
        holder.wait()


def freeze_holder_mid_work(team: Team) -> tuple[str, int]:
    """Freeze whoever holds the lease while it works (after its read, outside any transaction)."""
    while True:
        name, lease = wait_for(team.holder, "a lease holder")
        if team.phase(name) != WORKING:
            time.sleep(0.002)
            continue
        if team.freeze(name) == WORKING and not team.lock_held() and team.holder() == (name, lease):
            return name, lease.generation
        team.thaw(name)


def first(team: Team, **fields):
    """The first event in the team's history whose fields match."""
    def find():
        return next((e for e in team.history()
                     if all(getattr(e, k) == v for k, v in fields.items())), None)
    return find


@pytest.mark.parametrize("protected", [True, False], ids=["protected", "unprotected"])
def test_processes_hammering_one_file_under_freezes_and_kills(protected, tmp_path):
    """Protected, the checker passes a run with holders frozen past their lease and kills inside
    BEGIN IMMEDIATE; unprotected, the same faults let the frozen holders' stale writes land."""
    rng = random.Random(4)
    team = Team(4, protected=protected, seed=4, ttl=0.4, work=(0.05, 0.2), hold=(0.005, 0.03),
                rest=(0.0, 0.05), redeliver=0.1 if protected else 0.0, seconds=60, root=tmp_path)
    stale = []
    with team:
        team.start()
        for _ in range(2):   # freeze the holder mid-work until a successor has committed above it
            name, generation = freeze_holder_mid_work(team)
            assert proc_state(team.pid(name)) == "T"
            wait_for(lambda: any(e.action == "write" and e.outcome == "ok" and e.generation > generation
                                 for e in team.history()), "a successor's commit")
            assert team.thaw(name) is True                     # it outlived its lease
            stale.append(wait_for(lambda: next((e for e in team.history() if e.worker == name
                                                and e.action == "write" and e.generation == generation
                                                and e.outcome in ("ok", "rejected")), None),
                                  f"{name}'s stale write"))
        while team.counts["kills_in_tx"] < 2:          # kill holders inside BEGIN IMMEDIATE
            held = team.holder()
            if held is not None and team.kill_if_in_tx(held[0]):
                team.start(held[0])
            time.sleep(0.005)
        for _ in range(15):                              # and some seeded random pauses and kills
            name = rng.choice(team.names)
            if rng.random() < 0.7:
                team.freeze(name)
                time.sleep(rng.uniform(0.05, 0.3))
                team.thaw(name)
            else:
                team.kill(name)
                team.start(name)
            time.sleep(rng.uniform(0.0, 0.1))
        wait_for(lambda: sum(e.action == "write" and e.outcome == "ok" for e in team.history()) >= 20,
                 "twenty commits")
    assert not {n: c for n, c in team.exited().items() if c != -signal.SIGKILL}, "a worker crashed"
    assert team.counts["kills_in_tx"] >= 2 and team.counts["freezes_past_lease"] >= 2
    violations = check(team.history(), final=team.final())
    if protected:
        assert [e.outcome for e in stale] == ["rejected", "rejected"]
        assert violations == []
        assert team.ledger() == []
    else:
        assert [e.outcome for e in stale] == ["ok", "ok"]
        assert {"stale_accepted", "lost_update"} <= {v.kind for v in violations}
        assert set(stale) <= {v.event for v in violations if v.kind == "stale_accepted"}
    assert all(proc_state(p.pid) == "gone" for p in team.procs.values())
