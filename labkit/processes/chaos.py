"""Chaos: real faults thrown at real worker processes, judged from the recorded history.

``python -m labkit.chaos --workers N --seconds S [--seed K] [--unprotected]`` runs N workers
(:mod:`labkit.processes.workers`) on one SQLite file while this process, the nemesis, plays
a plan that is a pure function of the seed (:func:`schedule`): pauses (SIGSTOP, 50 ms to
three leases, one at most if the worker holds the write lock), freezes of the lease holder
between its read and its first write until a successor has committed above it, kills
(SIGKILL, then a restart) and hunts (kill the holder only if inside ``BEGIN IMMEDIATE``).
Holder freezes and hunts are retried until as many have landed as are due. Then
:func:`labkit.sim.check` judges the history; a summary and a timeline PNG are printed.
Exit status: 0 no violation; 1 violations (what ``--unprotected``, no fence and no keys,
must show); 2 the run did not do its job (a worker crashed by itself, or no holder was
frozen past its lease, or no kill landed inside a transaction). Real time on purpose.
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

from labkit.errors import BadArgument, check_number
from labkit.processes.live import draw, png
from labkit.processes.team import Team
from labkit.processes.workers import IN_TX
from labkit.sim import check

__all__ = ["Action", "Report", "fingerprint", "main", "run", "schedule"]


@dataclass(frozen=True, slots=True)
class Action:
    """One step of the nemesis's plan: ``at`` seconds, a ``kind`` (``"pause"``,
    ``"freeze_holder"``, ``"kill"``, ``"kill_in_tx"``), a ``worker`` index (-1: the holder),
    and ``seconds`` (how long a pause or freeze lasts, or a killed worker stays dead)."""

    at: float
    kind: str
    worker: int
    seconds: float


def schedule(seed: int, *, workers: int, seconds: float, ttl: float) -> tuple[Action, ...]:
    """Return the nemesis's plan, a pure function of its arguments, sorted by time.

    The first holder freeze comes between 12% and 25% of the run, the first hunt between
    30% and 45%; then pauses (log-uniform), kills, freezes and hunts until 70% of the run.

    Example:
        >>> schedule(1, workers=3, seconds=4, ttl=0.4) == schedule(1, workers=3, seconds=4, ttl=0.4)
        True
    """
    rng = random.Random(seed)
    first = round(seconds * rng.uniform(0.12, 0.25), 3)
    plan = [Action(first, "freeze_holder", -1, round(ttl * rng.uniform(3, 5), 3))]
    plan.append(Action(round(seconds * rng.uniform(0.3, 0.45), 3), "kill_in_tx", -1, 0.2))
    at = 0.4
    while (at := at + rng.expovariate(3.0)) < 0.7 * seconds:
        kind = rng.choices(["pause", "kill", "freeze_holder", "kill_in_tx"], [12, 4, 1, 2])[0]
        if kind == "pause":
            length = 0.05 * math.exp(rng.uniform(0, math.log(3 * ttl / 0.05)))
            plan.append(Action(round(at, 3), kind, rng.randrange(workers), round(length, 3)))
        elif kind == "kill":
            worker, dead = rng.randrange(workers), round(rng.uniform(0.05, 0.5), 3)
            plan.append(Action(round(at, 3), kind, worker, dead))
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
    """What a chaos run did (its settings, ``plan`` fingerprint, ``(action, outcome)`` counts,
    the team's ``counts``, workers' ``errors``) and what was found (``violations`` by kind,
    ``ledger`` mismatches); ``timeline`` is the PNG, ``run_dir`` the database, journals, logs."""

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
        outcomes, c = ["ok", "rejected", "duplicate", "held", "lost", "busy"], self.counts
        lines = [
            f"labkit chaos: {self.workers} workers, {self.seconds:g} s, seed {self.seed}, "
            f"{mode}; nemesis plan {self.plan}",
            f"{'':10}" + "".join(f"{o:>10}" for o in outcomes),
        ]
        for action in ("acquire", "raise", "read", "write", "renew", "release"):
            lines.append(
                f"{action:10}" + "".join(f"{self.outcomes[action, o]:>10}" for o in outcomes)
            )
        w = {o: self.outcomes["write", o] for o in ("ok", "rejected", "duplicate")}
        ledger = ", ".join(f"{i} is {a} but its lines sum to {s}" for i, a, s in self.ledger)
        violations = ", ".join(f"{k} {n}" for k, n in sorted(self.violations.items()))
        lines += [
            f"write attempts: {sum(w.values()) + c['kills_in_tx']}  committed: {w['ok']}  "
            f"rejected: {w['rejected']}  duplicates stopped: {w['duplicate']}  "
            f"killed inside BEGIN IMMEDIATE: {c['kills_in_tx']}",
            f"nemesis: {c['freezes']} freezes ({c['freezes_past_lease']} of a lease holder past "
            f"its lease), {c['kills']} kills ({c['kills_in_tx']} inside BEGIN IMMEDIATE), "
            f"{c['restarts']} restarts",
            f"ledger: {ledger or 'every invoice equals the sum of its charge lines'}",
            f"violations: {violations or 'none'}",
        ]
        lines += [f"worker error: {e}" for e in self.errors]
        if not c["freezes_past_lease"]:
            lines.append("run incomplete: no lease holder was frozen past its lease")
        if not c["kills_in_tx"]:
            lines.append("run incomplete: no kill landed inside a transaction")
        return "\n".join([*lines, f"timeline: {self.timeline}"])


def run(workers=4, seconds=10.0, *, seed=0, protected=True, ttl=0.4, progress=None, root=None):
    """Start the workers, play the nemesis's plan, judge the history; return a :class:`Report`.

    ``workers`` is 2 to 26, ``seconds`` at least 2; ``progress`` is a text stream for the
    progress line (e.g. ``sys.stderr``); ``root`` is where the run's folder is made.
    ``report.exit_code`` is the command's exit status.
    """
    workers = check_number(workers, "workers", integer=True, low=2, high=26)
    seconds = check_number(seconds, "seconds", low=2, high=86400)
    plan = schedule(seed, workers=workers, seconds=seconds, ttl=ttl)
    report = Report(workers, seconds, seed, protected, fingerprint(plan))
    knobs = dict(ttl=ttl, seconds=seconds, busy_timeout_ms=100, redeliver=0.1)
    knobs.update(work=(0.05, 0.25), hold=(0.005, 0.03), rest=(0.0, 0.1))
    team = Team(workers, protected=protected, seed=seed, root=root, **knobs)
    report.run_dir = team.run_dir
    try:
        _play(team, plan, report, ttl, progress)
        for name in team.names:  # then let the workers end by themselves, for a while
            team.thaw(name)
        end = team.now() + 2 + 3 * ttl
        while any(map(team.alive, team.names)) and team.now() < end:
            time.sleep(0.02)
    finally:
        team.stop()
    history = team.history()
    report.outcomes = Counter((e.action, e.outcome) for e in history)
    report.counts = Counter(team.counts)
    report.violations = Counter(v.kind for v in check(history, final=team.final()))
    report.ledger, report.timeline = team.ledger(), os.path.join(team.run_dir, "timeline.png")
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(report.violations.items())) or "no violation"
    params = {"protected": protected, "workers": workers, "ttl": ttl, "seed": seed}
    ax = draw(history, now=seconds, title=f"chaos run: {kinds}", params=params)
    png(ax, path=report.timeline)
    return report


def _play(team: Team, plan, report: Report, ttl: float, progress) -> None:
    seconds, steps, thaws, restarts, spared, shown = report.seconds, list(plan), {}, {}, {}, -1.0
    long = None  # (name, generation, since, until): the holder frozen past its lease
    team.start()
    while (now := team.now()) < seconds:
        if long is not None and now >= long[3]:
            name, generation, since, until = long
            if now >= min(2 * until - since, seconds - 0.3) or team.overtaken(generation):
                team.thaw(name)
                long, spared[name] = None, now + 1.0  # let it reach its stale write first
        for name in [n for n, at in thaws.items() if now >= at]:
            del thaws[name]
            team.thaw(name)
        for name, code in team.exited().items():
            if code != 0 or now < seconds - 0.5:
                report.errors.append(f"{name} exited with {code}; see {team.run_dir}/logs")
                restarts.setdefault(name, now)
        for name in [n for n, at in restarts.items() if now >= at]:
            del restarts[name]
            team.start(name)
        while steps and steps[0].at <= now:
            step = steps.pop(0)
            name = team.names[step.worker] if step.worker >= 0 else None
            if name is None or spared.get(name, 0.0) > now or not team.alive(name):
                continue
            if step.kind == "pause" and (phase := team.freeze(name)) is not None:
                blocking = phase == IN_TX or team.lock_held()  # it blocks every writer
                thaws[name] = now + (min(step.seconds, ttl) if blocking else step.seconds)
            elif step.kind == "kill":
                team.kill(name)
                thaws.pop(name, None)
                long = None if long and long[0] == name else long
                restarts[name] = now + step.seconds
        due = [a for a in plan if a.kind == "freeze_holder" and a.at <= now]
        if long is None and team.counts["freezes_past_lease"] < len(due):
            if caught := team.freeze_holder():
                long = (*caught, now, now + min(due[-1].seconds, max(seconds - now - 0.3, 0)))
        due = [a for a in plan if a.kind == "kill_in_tx" and a.at <= now]
        held = team.holder() if team.counts["kills_in_tx"] < len(due) else None
        if held and team.kill_if_in_tx(held[0]):
            restarts[held[0]] = now + due[-1].seconds
        if progress is not None and now - shown >= 0.25:
            shown = _progress(team, now, seconds, progress)
        time.sleep(0.01)
    if progress is not None:
        _progress(team, seconds, seconds, progress)
        progress.write("\n")


def _progress(team: Team, now: float, seconds: float, stream) -> float:
    commits = team.query("SELECT count(*) FROM invoice_lines WHERE run = ?", (team.run,))[0][0]
    bar, c = "#" * int(30 * min(1.0, now / seconds)), team.counts
    stream.write(
        f"\r[{bar:30}] {now:5.1f}/{seconds:g} s  commits {commits}  "
        f"freezes {c['freezes']} ({c['freezes_past_lease']} past lease)  "
        f"kills {c['kills']} ({c['kills_in_tx']} in tx)  "
    )
    stream.flush()
    return now


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
    parser.add_argument("--ttl", type=float, default=0.4, help="lease seconds (default 0.4)")
    parser.add_argument(
        "--dir", default=None, help="where to make the run's folder (default: temp)"
    )
    args = parser.parse_args(argv)
    options = dict(seed=args.seed, protected=not args.unprotected, ttl=args.ttl, root=args.dir)
    try:
        report = run(args.workers, args.seconds, progress=sys.stderr, **options)
    except BadArgument as exc:
        parser.error(str(exc))
    print(report.table())
    return report.exit_code
