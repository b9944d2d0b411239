"""The flake check: every test that starts processes or servers, run again and again (goal: 0).

A test file counts when its source starts something real: a subprocess, a fork, a signal sent,
a team of worker processes, a throwaway server (PostgreSQL, Redis, etcd), a sandboxed judge,
or the browser (the words in ``STARTS`` below), or when it is a contract module that runs on
PostgreSQL too (``tests/engines.py``'s ``CONTRACT``). Each run is one ``pytest`` over all of them, on three workers as
``make test`` runs them, with a JUnit file read back for the failures. At the end it prints,
for each test that ever failed, how many runs it failed in, and exits 1 if any did.

Run: ``make bench`` or ``python benchmarks/flakes.py [--runs 20] [--only test_etcd.py]``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: what a test file's source says when it starts a process or a server
STARTS = re.compile(
    r"subprocess\.|Popen|Team\(|Cluster\(|Throwaway|PostgresServer|pg_server|redis_pair|"
    r"Sandbox\(|\bjudged[,(]|judge\.\w+\(|_judge\(|chromium|playwright|labkit\.chaos|os\.fork|"
    r"os\.kill|LabServer"
)
MANDATORY = ("BROWSER", "POSTGRES", "ENGINES", "SANDBOX")  # no test may skip for want of one


def files(only: list[str] | None) -> list[Path]:
    """The test files that start processes or servers (``only``: these names among them)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from engines import CONTRACT

    found = [
        p
        for p in sorted((ROOT / "tests").glob("test_*.py"))
        if p.stem in CONTRACT or STARTS.search(p.read_text())
    ]
    return [p for p in found if not only or p.name in only]


def failures(junit: Path) -> dict[str, str]:
    """The test ids that failed or errored in one run's JUnit file, each with its message."""
    if not junit.exists():
        return {"(the run wrote no report)": ""}
    bad = {}
    for case in ET.parse(junit).iter("testcase"):
        found = case.find("failure")
        found = case.find("error") if found is None else found
        if found is not None:
            bad[f"{case.get('classname')}::{case.get('name')}"] = found.get("message", "")[:300]
    return bad


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="how many times (default 20)")
    parser.add_argument("--only", action="append", help="only this test file; repeatable")
    args, _ = parser.parse_known_args(argv)  # make bench passes every benchmark the same flags
    chosen = files(args.only)
    print(f"{len(chosen)} files start processes or servers: {' '.join(p.name for p in chosen)}")
    env = {**os.environ, **{f"LABKIT_REQUIRE_{what}": "1" for what in MANDATORY}}
    failed, seconds = Counter(), []
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(1, args.runs + 1):
            junit = Path(scratch) / f"run{run}.xml"
            began = time.perf_counter()
            argv = [sys.executable, "-m", "pytest", "-q", "-n", "3", "--dist", "loadfile"]
            argv += [f"--junitxml={junit}", *map(str, chosen)]
            subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
            seconds.append(time.perf_counter() - began)
            bad = failures(junit)
            failed.update(list(bad))
            print(f"run {run}/{args.runs}: {len(bad)} failed in {seconds[-1]:.0f} s", flush=True)
            for test, message in bad.items():
                print(f"    {test}\n        {message}", flush=True)
    print(f"\n{args.runs} runs of {len(chosen)} files, {sum(seconds):.0f} s in all")
    for test, times in failed.most_common():
        print(f"  failed {times}/{args.runs}: {test}")
    print(f"flaky tests: {len(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
