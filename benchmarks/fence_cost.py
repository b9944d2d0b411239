"""What a fence costs: one insert transaction, three ways, side by side in one run.

* ``plain``     -- ``BEGIN IMMEDIATE; INSERT; COMMIT`` (labkit.db.transaction + execute)
* ``guard``     -- the same insert through ``Fence.guard``: the conditional
                   ``UPDATE job_fence ...`` (its row count) first, then the insert
* ``protected`` -- the same plain transaction into a table guarded by
                   ``Fence.protect``: SQLite's trigger checks the token and
                   raises the fence inside the INSERT itself

Each runs on a file database in WAL mode at ``synchronous=NORMAL`` and ``FULL``,
and on ``:memory:``. The variants are interleaved in rounds (the order rotates
each round) so that machine noise lands on all of them alike; the table shows
ops/s over all rounds and the ratio to ``plain``, the median of the per-round
ratios (which shrugs off a noisy round) and the ratio in CPU time (which other
processes on a busy machine cannot disturb, but which does not see fsync waits,
so trust wall time at FULL). FULL runs a quarter of the transactions per round.

Run: ``python benchmarks/fence_cost.py [--rounds 40] [--ops 150] [--dir /tmp]``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import labkit  # noqa: E402
from labkit.db import execute, transaction  # noqa: E402

JOB = "invoice-run"
TABLE = """CREATE TABLE {name} (
    job_id TEXT NOT NULL, invoice_id TEXT NOT NULL, amount INTEGER NOT NULL,
    generation INTEGER NOT NULL, PRIMARY KEY (job_id, invoice_id))"""
VARIANTS = ("plain", "guard", "protected")


def setup(path: str, synchronous: str | None):
    """A labkit database with three identical tables, one of them protected."""
    db = labkit.connect(path)
    if synchronous:
        execute(db, f"PRAGMA synchronous = {synchronous}")
    for name in ("plain_t", "guard_t", "protected_t"):
        execute(db, TABLE.format(name=name))
    fence = labkit.Fence(db, JOB)
    fence.protect("protected_t")
    return db, fence


def run_variant(variant: str, db, fence, start: int, ops: int) -> tuple[float, float]:
    """Do ``ops`` insert transactions of ``variant``; return (wall seconds, CPU seconds)."""
    rows = [(JOB, f"INV-{start + i}", 100 + i % 7, 8) for i in range(ops)]
    began, cpu = time.perf_counter(), time.process_time()
    if variant == "plain":
        for row in rows:
            with transaction(db):
                execute(db, "INSERT INTO plain_t VALUES (?, ?, ?, ?)", row)
    elif variant == "guard":
        for row in rows:
            with fence.guard(8) as tx:
                tx.execute("INSERT INTO guard_t VALUES (?, ?, ?, ?)", row)
    else:
        for row in rows:
            with transaction(db):
                execute(db, "INSERT INTO protected_t VALUES (?, ?, ?, ?)", row)
    return time.perf_counter() - began, time.process_time() - cpu


def measure(path: str, synchronous: str | None, rounds: int, ops: int) -> dict:
    """Interleave the variants for ``rounds`` rounds; return, per variant, (ops/s, ratio,
    median per-round ratio, CPU ratio), every ratio taken against ``plain``."""
    db, fence = setup(path, synchronous)
    for variant in VARIANTS:                       # warm up caches and the file
        run_variant(variant, db, fence, 10 ** 9, 50)
    wall = {v: 0.0 for v in VARIANTS}
    cpu = {v: 0.0 for v in VARIANTS}
    ratios = {v: [] for v in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % 3:] + VARIANTS[:r % 3]
        took = {v: run_variant(v, db, fence, r * ops, ops) for v in order}
        for v in VARIANTS:
            wall[v] += took[v][0]
            cpu[v] += took[v][1]
            ratios[v].append(took["plain"][0] / took[v][0])
    assert execute(db, "SELECT count(*) FROM protected_t") == [(rounds * ops + 50,)]
    assert fence.current() == 8
    db.conn.close()
    return {v: (rounds * ops / wall[v], wall["plain"] / wall[v], statistics.median(ratios[v]),
                cpu["plain"] / cpu[v]) for v in VARIANTS}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--ops", type=int, default=150, help="transactions per variant per round")
    parser.add_argument("--dir", default=None, help="where the file databases go (default: the temp dir)")
    args = parser.parse_args(argv)
    setups = [("file WAL, synchronous=NORMAL", "NORMAL", 1), ("file WAL, synchronous=FULL", "FULL", 4),
              (":memory:", None, 1)]
    print(f"fence cost: {args.rounds} rounds of {args.ops} insert transactions per variant "
          f"({args.ops // 4} at FULL), variants interleaved; SQLite {sqlite3.sqlite_version}")
    print(f"{'database':<29} {'variant':<10} {'ops/s':>8} {'vs plain':>9} {'median':>7} {'cpu':>6}")
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for label, synchronous, fewer in setups:
            path = ":memory:" if synchronous is None else os.path.join(folder, f"{synchronous}.db")
            figures = measure(path, synchronous, args.rounds, max(1, args.ops // fewer))
            for variant, (rate, ratio, median, cpu_ratio) in figures.items():
                print(f"{label:<29} {variant:<10} {rate:>8.0f} {ratio:>9.2f} {median:>7.2f} {cpu_ratio:>6.2f}")
    print("vs plain: ops/s ratio over all rounds; median: of the per-round ratios; "
          "cpu: the same ratio in CPU time\n(immune to other processes, blind to fsync waits).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
