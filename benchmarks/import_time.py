"""How long ``import labkit`` takes in a fresh interpreter (goal: 0.3 s), by ``python -X importtime``.

Each of ``--repeat`` runs starts a new interpreter; the figure is labkit's cumulative import
time as Python itself reports it, with the interpreter's bare start-up (``-c pass``) beside it in
the same run, and the five slowest modules of the median run.

Run: ``make bench`` or ``python benchmarks/import_time.py [--repeat 7]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def importtime(code: str) -> tuple[float, list[tuple[int, str]]]:
    """Wall seconds of one fresh interpreter running ``code``, and its (self µs, module) lines."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - began
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            own, cumulative, name = line[len("import time:") :].split("|")
            rows.append((int(cumulative), int(own), name.strip()))
    return wall, rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args, _ = parser.parse_known_args(argv)
    runs = [importtime("import labkit") for _ in range(args.repeat)]
    bare = statistics.median(importtime("pass")[0] for _ in range(args.repeat))
    totals = [next(c for c, _, name in rows if name == "labkit") / 1e6 for _, rows in runs]
    median = statistics.median(totals)
    print(f"import labkit: median {median:.3f} s, best {min(totals):.3f} s over {args.repeat} runs "
          f"(goal 0.3 s); a bare interpreter starts in {bare:.3f} s")
    _, rows = runs[totals.index(sorted(totals)[len(totals) // 2])]
    for _, own, name in sorted(rows, key=lambda r: r[1], reverse=True)[:5]:
        print(f"  {own / 1e3:7.1f} ms  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
