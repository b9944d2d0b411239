"""Run every benchmark in this folder, one after another, printing each one's figures.

Every ``benchmarks/*.py`` except this file is run as its own process with the
same Python (so one benchmark's caches, threads or files cannot colour the
next one's figures), in name order. Extra arguments are passed to each.
It exits non-zero if any benchmark failed, after running them all.

Run: ``make bench`` or ``python benchmarks/run.py [--only fence_cost]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def benchmarks(only: list[str] | None = None) -> list[Path]:
    """The benchmark scripts beside this one, in name order (``only``: these stems)."""
    found = sorted(p for p in HERE.glob("*.py") if p.name != Path(__file__).name and not p.name.startswith("_"))
    return [p for p in found if not only or p.stem in only]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", help="run only this benchmark (stem); repeatable")
    args, extra = parser.parse_known_args(argv)
    scripts = benchmarks(args.only)
    if not scripts:
        print("no benchmarks found", file=sys.stderr)
        return 1
    failed = []
    for script in scripts:
        print(f"== {script.stem} ==", flush=True)
        began = time.perf_counter()
        code = subprocess.call([sys.executable, str(script), *extra], cwd=HERE.parent)
        print(f"== {script.stem}: {'ok' if code == 0 else f'FAILED (exit {code})'} "
              f"in {time.perf_counter() - began:.1f} s ==\n", flush=True)
        if code:
            failed.append(script.stem)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
