"""A room of 30 students on one classroom server: does the fence hold, and what does it cost?

Each student is its own OS process with its own connection, running labkit's student worker
(acquire, write, renew, write, release) for ``--seconds`` (30), once with fenced writes and once
without. A nemesis in this process pauses two random students through the control row every
second, each for three leases, so that they write after their lease has passed to someone else.
It prints attempts (acquires tried), commits, stale writes refused, the p50/p95 of one write's
round trip, and what the history checker finds in the server's event log: nothing when fenced,
stale writes accepted when not. It exits non-zero if either verdict is wrong.

The live view: while the protected room runs, ``watch(room)`` redraws back to back in this
process (redraws per second, and one redraw's time: the goal is 1 s or less); then, on a log of
10,000 and of 100,000 events of 30 students, one cold ``draw`` (a new view: its window's rows
and the SQL totals over the whole log, then the PNG) and warm redraws (what is new, then the
PNG).

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
from labkit.processes.room_view import Picture, View, png, watch  # noqa: E402
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
    watcher = watch(room, every=0.001, show=lambda _: None) if protected else None
    start.set()
    began = time.perf_counter()
    while time.perf_counter() - began < args.seconds - 3 * args.ttl:  # pauses that can end in time
        chosen = nemesis.sample(names, 2)
        room.pause(chosen, 3 * args.ttl)
        paused += len(chosen)
        time.sleep(1.0)
    redraws = None
    if watcher:
        watcher.stop()
        redraws = (watcher.redraws / (time.perf_counter() - began), watcher.times)
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
        violations=dict(found), paused_writes=outcomes["pause", "ok"], redraws=redraws,
    )  # fmt: skip


#: a log of ``n`` events of 30 students, ``step`` s apart, ending now (acquire, write, renew,
#: write, release, five refused acquires per lease; every 13th lease's second write refused)
SYNTHETIC = """INSERT INTO labkit.events (at, student, action, outcome, generation, until)
SELECT clock_timestamp() - make_interval(secs => ($1 - i) * $2),
    ($3::text[])[((i / 10) * 7) % cardinality($3::text[]) + 1],
    (ARRAY['acquire', 'write', 'renew', 'write', 'release', 'acquire', 'acquire', 'acquire',
           'acquire', 'acquire'])[i % 10 + 1],
    CASE WHEN i % 10 >= 5 THEN 'held' WHEN i % 10 = 3 AND (i / 10) % 13 = 0 THEN 'rejected'
         ELSE 'ok' END,
    CASE WHEN i % 10 < 5 THEN $4 + i / 10 END,
    CASE WHEN i % 10 IN (0, 2) THEN clock_timestamp()
        - make_interval(secs => ($1 - i) * $2) + interval '0.5 s' END
FROM generate_series(1, $1) AS i"""


def view_figures(server_url: str, url: str, students: int) -> list[tuple]:
    """Cold draw and warm redraw seconds on logs of 10,000 and 100,000 events."""
    room = Room(server_url)
    room.reset()
    names = [f"s{i:02d}" for i in range(students)]
    for s in [register(url, n) for n in names]:
        s.close()
    figures = []
    for n in (10_000, 100_000):  # 1.3 ms apart: 100,000 events are about 130 s of a room
        room.conn.execute("TRUNCATE labkit.events")
        room.conn.execute(SYNTHETIC, [n, 0.0013, names, 0])  # $1..$4
        began = time.perf_counter()
        view, picture = View(room), Picture()
        png(picture.show(view.update()).ax)
        cold = time.perf_counter() - began
        warm = []
        for k in range(5):  # 300 new events before each redraw: about 0.4 s of a busy room
            params = [300, 0.0013, names, n + 300 * k]
            room.conn.execute(SYNTHETIC, params)
            began = time.perf_counter()
            png(picture.show(view.update()).ax)
            warm.append(time.perf_counter() - began)
        figures.append((n, cold, statistics.median(warm), len(view.rows), view.read))
    room.close()
    return figures


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
        view = view_figures(server.url, url, args.students)
        watchdog.stop()
    head = f"{'mode':<12}{'attempts':>9}{'leases':>8}{'commits':>8}{'stale refused':>14}"
    print(head + f"{'paused':>7}{'write p50 ms':>13}{'p95 ms':>8}  history checker")
    for r in results:
        verdict = (
            ", ".join(f"{k} {n}" for k, n in sorted(r["violations"].items())) or "no violation"
        )
        print(f"{r['mode']:<12}{r['attempts']:>9}{r['leases']:>8}{r['commits']:>8}"
              f"{r['refused']:>14}{r['paused_writes']:>7}{r['p50']:>13.2f}{r['p95']:>8.2f}  {verdict}")  # fmt: skip
    times = results[0]["redraws"][1]
    print(f"watch(room) with {args.students} students working: "
          f"{results[0]['redraws'][0]:.1f} redraws/s back to back, one redraw "
          f"p50 {statistics.median(times):.2f} s, max {max(times):.2f} s (goal <= 1 s)")
    print(f"{'events':>8}{'cold draw s':>12}{'warm redraw s':>14}{'rows drawn':>11}{'rows read':>10}")
    for n, cold, warm, rows, read in view:
        print(f"{n:>8}{cold:>12.2f}{warm:>14.2f}{rows:>11}{read:>10}")
    good = not results[0]["violations"] and results[1]["violations"].get("stale_accepted", 0) > 0
    print("fence holds: no violation protected, stale writes accepted unprotected" if good
          else "UNEXPECTED: the verdicts are not as they should be")  # fmt: skip
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
