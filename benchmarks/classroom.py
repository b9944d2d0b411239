"""A room of 30 students on one classroom server: does the fence hold, and what does it cost?

Each student is its own OS process with its own connection, running labkit's student worker
(acquire, write, renew, write, release) for ``--seconds`` (30), once with fenced writes and once
without. A nemesis in this process pauses two random students through the control row every
second, each for three leases, so that they write after their lease has passed to someone else.
It prints attempts (acquires tried), commits, stale writes refused, the p50/p95 of one write's
round trip, and what the history checker finds in the server's event log: nothing when fenced,
stale writes accepted when not. It exits non-zero if either verdict is wrong.

Run: ``python benchmarks/classroom.py [--seconds 30] [--students 30] [--ttl 0.5]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labkit.engines import classroom  # noqa: E402
from labkit.engines.postgres import PostgresServer  # noqa: E402
from labkit.engines.room import Room, Watchdog  # noqa: E402
from labkit.engines.student import register, work  # noqa: E402
from labkit.processes.live import room_history as history  # noqa: E402
from labkit.sim import check  # noqa: E402


def student(url: str, name: str, seconds: float, start, out) -> None:
    """One student's process: register, wait for the start, work ``seconds``, report timings."""
    me, timings, stop = register(url, name), [], threading.Event()
    start.wait()
    threading.Timer(seconds, stop.set).start()
    try:
        work(me, stop, rng=random.Random(name), clock=time.perf_counter, timings=timings)
    finally:
        me.close()
        out.put(timings)


def run(server_url: str, url: str, args, protected: bool) -> dict:
    """One run of the room; return its figures."""
    room = Room(server_url)
    room.reset()
    room.protect(protected)  # the server decides; the students' calls are the same
    ctx = multiprocessing.get_context("fork")  # fast; the children touch nothing of ours
    start, out = ctx.Event(), ctx.Queue()
    names = [f"s{i:02d}" for i in range(args.students)]
    procs = [ctx.Process(target=student, args=(url, n, args.seconds, start, out))
             for n in names]  # fmt: skip
    for p in procs:
        p.start()
    while len(room.students()) < len(names):
        time.sleep(0.05)
    nemesis, paused = random.Random(args.seed), 0
    start.set()
    began = time.perf_counter()
    while time.perf_counter() - began < args.seconds - 3 * args.ttl:  # pauses that can end in time
        chosen = nemesis.sample(names, 2)
        room.pause(chosen, 3 * args.ttl)
        paused += len(chosen)
        time.sleep(1.0)
    timings = [t for _ in procs for t in out.get(timeout=args.seconds + 60)]
    for p in procs:
        p.join(30)
    rows = room.events()
    room.close()
    events = history(rows)
    outcomes = Counter((e.action, e.outcome) for e in events)
    found = Counter(v.kind for v in check(events))
    cut = statistics.quantiles(timings, n=100) if len(timings) > 1 else [float("nan")] * 99
    return dict(
        mode="protected" if protected else "unprotected", pauses=paused,
        attempts=sum(n for (a, _), n in outcomes.items() if a == "acquire"),
        leases=outcomes["acquire", "ok"], commits=outcomes["write", "ok"],
        refused=outcomes["write", "rejected"], p50=cut[49] * 1000, p95=cut[94] * 1000,
        violations=dict(found), paused_writes=outcomes["pause", "ok"],
    )  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--ttl", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args, _ = parser.parse_known_args(argv)
    with PostgresServer() as server:
        password = classroom.install(server.url, ttl=args.ttl, seats=args.students)
        watchdog = Watchdog(server.url).start()
        url = f"postgresql://labkit_room:{password}@127.0.0.1:{server.port}/postgres"
        print(f"{args.students} student processes, {args.seconds:g} s each run, "
              f"lease {args.ttl:g} s, 2 students paused for {3 * args.ttl:g} s every second")  # fmt: skip
        results = [run(server.url, url, args, protected) for protected in (True, False)]
        watchdog.stop()
    head = f"{'mode':<12}{'attempts':>9}{'leases':>8}{'commits':>8}{'stale refused':>14}"
    print(head + f"{'paused':>7}{'write p50 ms':>13}{'p95 ms':>8}  history checker")
    for r in results:
        verdict = (
            ", ".join(f"{k} {n}" for k, n in sorted(r["violations"].items())) or "no violation"
        )
        print(f"{r['mode']:<12}{r['attempts']:>9}{r['leases']:>8}{r['commits']:>8}"
              f"{r['refused']:>14}{r['paused_writes']:>7}{r['p50']:>13.2f}{r['p95']:>8.2f}  {verdict}")  # fmt: skip
    good = not results[0]["violations"] and results[1]["violations"].get("stale_accepted", 0) > 0
    print("fence holds: no violation protected, stale writes accepted unprotected" if good
          else "UNEXPECTED: the verdicts are not as they should be")  # fmt: skip
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
