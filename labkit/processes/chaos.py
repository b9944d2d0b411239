"""Chaos: real faults thrown at real worker processes, judged from the recorded history.

Usage::

    python -m labkit.chaos --workers N --seconds S [--seed K] [--unprotected]

N worker processes (:mod:`labkit.processes.workers`) run the invoice job on one SQLite
file: acquire, raise the fence, read, work, fenced upserts with operation keys,
renew, release. This process is the nemesis. Its plan (:func:`schedule`) is a
pure function of the seed, the number of workers, the run's length and the
lease: the same seed gives the same plan. The plan mixes four faults:

* pauses: SIGSTOP a worker, SIGCONT it 50 ms to three leases later (cut to one
  lease if it was caught holding the write lock, which blocks every writer);
* holder freezes: SIGSTOP the lease holder after its read and before its first
  write, for three to five leases, and longer (up to twice that) until a
  successor has committed above it; once thawed it is spared other faults for
  a second, so that it reaches its stale write;
* kills: SIGKILL a worker (stopped first, so the nemesis knows whether it was
  inside a transaction) and restart it after a planned delay;
* hunts: stop the holder for an instant and kill it only if it is inside
  ``BEGIN IMMEDIATE`` (confirmed by finding the write lock held), else let it go.

A holder freeze that did not outlive the lease, or a hunt that has not killed
inside a transaction yet, is retried until it has, within the run; the first
of each comes early in every plan. Faults start in the first 70% of the run.

Every attempt and answer is recorded (see :mod:`labkit.processes.workers`); at the end
:func:`labkit.sim.history.check` judges the history and the final table, and the
run prints a summary and the path of a timeline PNG. A progress line goes to
stderr while it runs.

Exit status: 0 when the checker finds no violation, 1 when it finds any, 2
when the run itself did not do its job (a worker crashed on its own, or the
nemesis could not freeze a holder past its lease or kill inside a transaction).
Protected, the pass is 0. ``--unprotected`` (no fence, no keys) must show
violations, so it exits 1.

The long version, for "does it really hold?" (about two minutes each)::

    python -m labkit.chaos --workers 8 --seconds 120 --seed 1
    python -m labkit.chaos --workers 8 --seconds 120 --seed 1 --unprotected

The short version runs in the test suite (``tests/test_chaos.py``).
This module reads the real clock on purpose.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from labkit.db import execute
from labkit.errors import BadArgument
from labkit.sim.history import check
from labkit.processes.live import draw, png
from labkit.processes.workers import IN_TX, WORKING
from labkit.processes.team import Team

__all__ = ["Action", "schedule", "fingerprint", "Report", "run", "main"]


@dataclass(frozen=True, slots=True)
class Action:
    """One step of the nemesis's plan.

    Attributes:
        at: seconds after the start.
        kind: ``"pause"``, ``"freeze_holder"``, ``"kill"`` or ``"kill_in_tx"``.
        worker: the worker's index, or -1 for "whoever holds the lease then".
        seconds: how long a pause lasts, or how long a killed worker stays dead.
    """

    at: float
    kind: str
    worker: int
    seconds: float


def schedule(seed: int, *, workers: int, seconds: float, ttl: float) -> tuple[Action, ...]:
    """Return the nemesis's plan: a pure function of its arguments (the same seed, the same plan).

    Random pauses last from 50 ms to three leases (log-uniform); freezes of the
    lease holder last three to five leases (the first between 12% and 25% of the
    run); hunts for a kill inside a transaction (the first between 30% and 45%);
    random kills, each with a restart delay. Everything starts in the first 70%
    of the run.

    Example:
        >>> schedule(1, workers=3, seconds=4, ttl=0.4) == schedule(1, workers=3, seconds=4, ttl=0.4)
        True
    """
    rng = random.Random(seed)
    plan = [
        Action(
            round(seconds * rng.uniform(0.12, 0.25), 3),
            "freeze_holder",
            -1,
            round(ttl * rng.uniform(3, 5), 3),
        ),
        Action(round(seconds * rng.uniform(0.3, 0.45), 3), "kill_in_tx", -1, 0.2),
    ]
    at = 0.4
    while (at := at + rng.expovariate(3.0)) < 0.7 * seconds:
        kind = rng.choices(["pause", "kill", "freeze_holder", "kill_in_tx"], [12, 4, 1, 2])[0]
        if kind == "pause":
            length = 0.05 * math.exp(rng.uniform(0, math.log(3 * ttl / 0.05)))
            plan.append(Action(round(at, 3), kind, rng.randrange(workers), round(length, 3)))
        elif kind == "kill":
            plan.append(
                Action(round(at, 3), kind, rng.randrange(workers), round(rng.uniform(0.05, 0.5), 3))
            )
        elif kind == "freeze_holder":
            plan.append(Action(round(at, 3), kind, -1, round(ttl * rng.uniform(3, 5), 3)))
        else:
            plan.append(Action(round(at, 3), kind, -1, 0.2))
    return tuple(sorted(plan, key=lambda a: a.at))


def fingerprint(plan) -> str:
    """A short hash of a plan, printed so two runs can be compared."""
    return hashlib.sha256(repr(plan).encode()).hexdigest()[:12]


@dataclass
class Report:
    """What a chaos run did and what the checker found.

    Attributes:
        workers, seconds, seed, protected: the run's settings. plan: the nemesis's fingerprint.
        outcomes: ``Counter`` of ``(action, outcome)`` over the history.
        counts: the nemesis's counts (freezes, freezes_past_lease, kills, kills_in_tx, restarts).
        violations: ``Counter`` of violation kinds. ledger: invoices whose amount is not the
        sum of their lines. errors: workers that exited on their own with an error.
        timeline: the PNG's path. run_dir: the run's folder (database, journals, logs).
    """

    workers: int
    seconds: float
    seed: int
    protected: bool
    plan: str
    outcomes: Counter = field(default_factory=Counter)
    counts: Counter = field(default_factory=Counter)
    violations: Counter = field(default_factory=Counter)
    ledger: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    timeline: str = ""
    run_dir: str = ""

    @property
    def exit_code(self) -> int:
        """0: no violation; 1: violations; 2: the run did not do its job."""
        if self.errors or not self.counts["kills_in_tx"] or not self.counts["freezes_past_lease"]:
            return 2
        return 1 if self.violations else 0

    def table(self) -> str:
        """The summary as text."""
        mode = "protected" if self.protected else "UNPROTECTED (no fence, no keys)"
        outcomes = ["ok", "rejected", "duplicate", "held", "lost", "busy"]
        lines = [
            f"labkit chaos: {self.workers} workers, {self.seconds:g} s, seed {self.seed}, {mode}; "
            f"nemesis plan {self.plan}",
            f"{'':10}" + "".join(f"{o:>10}" for o in outcomes),
        ]
        for action in ("acquire", "raise", "read", "write", "renew", "release"):
            lines.append(
                f"{action:10}" + "".join(f"{self.outcomes[action, o]:>10}" for o in outcomes)
            )
        c = self.counts
        lines += [
            f"write attempts: {self.attempts}  committed: {self.outcomes['write', 'ok']}  "
            f"rejected: {self.outcomes['write', 'rejected']}  "
            f"duplicates stopped: {self.outcomes['write', 'duplicate']}  "
            f"killed inside BEGIN IMMEDIATE: {c['kills_in_tx']}",
            f"nemesis: {c['freezes']} freezes ({c['freezes_past_lease']} of a lease holder past "
            f"its lease), {c['kills']} kills ({c['kills_in_tx']} inside BEGIN IMMEDIATE), "
            f"{c['restarts']} restarts",
            "ledger: "
            + (
                "every invoice equals the sum of its charge lines"
                if not self.ledger
                else ", ".join(f"{i} is {a} but its lines sum to {s}" for i, a, s in self.ledger)
            ),
            "violations: "
            + (", ".join(f"{k} {n}" for k, n in sorted(self.violations.items())) or "none"),
        ]
        lines += [f"worker error: {e}" for e in self.errors]
        if not c["freezes_past_lease"]:
            lines.append("run incomplete: no lease holder was frozen past its lease")
        if not c["kills_in_tx"]:
            lines.append("run incomplete: no kill landed inside a transaction")
        lines.append(f"timeline: {self.timeline}")
        return "\n".join(lines)

    @property
    def attempts(self) -> int:
        """Write attempts: those answered (ok, rejected, duplicate) plus those killed in flight."""
        return (
            sum(self.outcomes["write", o] for o in ("ok", "rejected", "duplicate"))
            + self.counts["kills_in_tx"]
        )


def run(
    workers: int = 4,
    seconds: float = 10.0,
    *,
    seed: int = 0,
    protected: bool = True,
    ttl: float = 0.4,
    progress=None,
    root: str | None = None,
) -> Report:
    """Run the chaos: start the workers, play the nemesis's plan, judge the history.

    Args:
        workers: worker processes (2 to 26). seconds: the run's length (>= 2).
        seed: the nemesis's and the workers' seed. protected: the write path.
        ttl: the lease. progress: a text stream for the progress line (e.g. ``sys.stderr``).
        root: where the run's folder is made (default: the system's temporary folder).

    Returns:
        A :class:`Report`; ``report.exit_code`` is the command's exit status.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or not 2 <= workers <= 26:
        raise BadArgument("workers", f"must be an int from 2 to 26, got {workers!r}")
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not 2 <= seconds <= 86400
    ):
        raise BadArgument(
            "seconds", f"must be a number of seconds from 2 to 86400, got {seconds!r}"
        )
    plan = schedule(seed, workers=workers, seconds=seconds, ttl=ttl)
    report = Report(workers, seconds, seed, protected, fingerprint(plan))
    team = Team(
        workers,
        protected=protected,
        seed=seed,
        ttl=ttl,
        work=(0.05, 0.25),
        hold=(0.005, 0.03),
        rest=(0.0, 0.1),
        invoices=3,
        redeliver=0.1,
        busy_timeout_ms=100,
        seconds=seconds,
        root=root,
    )
    report.run_dir = team.run_dir
    try:
        _play(team, plan, report, seconds, ttl, progress)
        team.finish(timeout=2 + 3 * ttl)
    finally:
        team.stop()
    history, final = team.history(), team.final()
    report.outcomes = Counter((e.action, e.outcome) for e in history)
    report.counts = Counter(team.counts)
    report.violations = Counter(v.kind for v in check(history, final=final))
    report.ledger = team.ledger()
    report.timeline = _timeline(team, history, report)
    return report


def _play(team: Team, plan, report: Report, seconds: float, ttl: float, progress) -> None:
    thaws, restarts, steps, shown = {}, {}, list(plan), -1.0
    freezes = [a for a in plan if a.kind == "freeze_holder"]
    hunts = [a for a in plan if a.kind == "kill_in_tx"]
    long_freeze, since = (
        None,
        0.0,
    )  # the holder frozen past its lease (until thawed), and since when
    spared = {}  # name -> until when random faults leave it alone
    team.start()
    while (now := team.now()) < seconds:
        for name, at in list(thaws.items()):
            if (
                name == long_freeze
                and now >= at
                and now < min(2 * at - since, seconds - 0.3)
                and not _overtaken(team, team._frozen.get(name))
            ):
                continue  # hold the frozen holder until a successor has committed above it
            if now >= at:
                team.thaw(name)
                del thaws[name]
                if name == long_freeze:  # let it reach its (stale) write before any other fault
                    long_freeze, spared[name] = None, now + 1.0
        for name, code in team.exited().items():
            if code != 0 or now < seconds - 0.5:
                report.errors.append(f"{name} exited with {code}; see {team.run_dir}/logs")
                restarts.setdefault(name, now)
        for name, at in list(restarts.items()):
            if now >= at:
                team.start(name)
                del restarts[name]
        while steps and steps[0].at <= now:
            step = steps.pop(0)
            name = team.names[step.worker] if step.worker >= 0 else None
            if name is not None and spared.get(name, 0.0) > now:
                continue
            if step.kind == "pause" and team.alive(name) and name not in thaws:
                phase = team.freeze(name)
                if (
                    phase is not None
                ):  # a worker frozen holding the write lock blocks all: keep it short
                    blocking = phase == IN_TX or team.lock_held()
                    thaws[name] = now + (min(step.seconds, ttl) if blocking else step.seconds)
            elif step.kind == "kill" and team.alive(name):
                team.kill(name)
                thaws.pop(name, None)
                long_freeze = None if name == long_freeze else long_freeze
                restarts[name] = now + step.seconds
        held = team.holder()
        owner = held[0] if held is not None and held[0] not in thaws else None
        # Planned freezes of the holder mid-work: retried until that many outlived their lease.
        due = [a for a in freezes if a.at <= now]
        if (
            owner
            and long_freeze is None
            and team.counts["freezes_past_lease"] < len(due)
            and team.phase(owner) == WORKING
        ):
            phase = team.freeze(owner)
            if phase == WORKING and not team.lock_held():
                long_freeze, since = owner, now
                thaws[owner] = now + min(due[-1].seconds, max(seconds - now - 0.3, 0))
            elif phase is not None:  # caught holding the write lock: let it go, try again later
                thaws[owner] = now + 0.05
        # Planned hunts: retried until that many kills have landed inside BEGIN IMMEDIATE.
        due = [a for a in hunts if a.at <= now]
        if owner and team.counts["kills_in_tx"] < len(due) and team.kill_if_in_tx(owner):
            restarts[owner] = now + due[-1].seconds
        if progress is not None and now - shown >= 0.25:
            shown = now
            _progress(team, report, now, seconds, progress)
        time.sleep(0.01)
    if progress is not None:
        _progress(team, report, seconds, seconds, progress)
        progress.write("\n")


def _overtaken(team: Team, frozen) -> bool:
    """True once a write with a generation above the frozen holder's has committed."""
    if not frozen:
        return True
    top = execute(
        team.db,
        "SELECT max(generation) FROM history WHERE run = ? AND action = 'write'",
        (team.run,),
    )[0][0]
    return top is not None and top > frozen[0]


def _progress(team: Team, report: Report, now: float, seconds: float, stream) -> None:
    done = min(1.0, now / seconds)
    commits = execute(team.db, "SELECT count(*) FROM history WHERE run = ?", (team.run,))[0][0]
    c = team.counts
    stream.write(
        f"\r[{'#' * int(30 * done):30}] {now:5.1f}/{seconds:g} s  commits {commits}  "
        f"freezes {c['freezes']} ({c['freezes_past_lease']} past lease)  "
        f"kills {c['kills']} ({c['kills_in_tx']} in tx)  "
    )
    stream.flush()


def _timeline(team: Team, history, report: Report) -> str:
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(report.violations.items())) or "no violation"
    params = {
        "protected": report.protected,
        "workers": report.workers,
        "ttl": team.options["ttl"],
        "seed": report.seed,
    }
    path = os.path.join(team.run_dir, "timeline.png")
    png(draw(history, now=report.seconds, title=f"chaos run: {kinds}", params=params), path=path)
    return path


def main(argv: list[str] | None = None) -> int:
    """The command line: run, print the summary, return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m labkit.chaos", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="length of the run (default 10)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the nemesis and the workers")
    parser.add_argument("--unprotected", action="store_true", help="write without fence and keys")
    parser.add_argument(
        "--ttl", type=float, default=0.4, help="lease length in seconds (default 0.4)"
    )
    parser.add_argument(
        "--dir", default=None, help="where to make the run's folder (default: a temp folder)"
    )
    args = parser.parse_args(argv)
    try:
        report = run(
            args.workers,
            args.seconds,
            seed=args.seed,
            protected=not args.unprotected,
            ttl=args.ttl,
            progress=sys.stderr,
            root=args.dir,
        )
    except BadArgument as exc:
        parser.error(str(exc))
    print(report.table())
    return report.exit_code
