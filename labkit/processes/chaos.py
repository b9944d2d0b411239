"""Chaos: real faults thrown at real worker processes, judged from the recorded history.

``python -m labkit.chaos --workers N --seconds S [--seed K] [--unprotected] [--issuer etcd]``:
N workers share one SQLite file while the nemesis plays :func:`schedule` (a pure function of the
seed) and, if etcd issues the leases, SIGKILLs its leader twice. Exit 0: no violation; 1: some
(what ``--unprotected`` must show); 2: the run did not do its job (a worker crashed by itself, no
holder was frozen past its lease, or no kill landed in a transaction). Real time on purpose."""

import argparse
import hashlib
import math
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from labkit.engines.etcd_cluster import for_chaos
from labkit.errors import BadArgument, check_number
from labkit.processes.live import draw, png
from labkit.processes.team import Team
from labkit.processes.workers import IN_TX
from labkit.sim import check, warnings

__all__ = ["TTL", "Action", "main", "run", "schedule"]

TTL = 0.4  # the workers' lease, in seconds


@dataclass(frozen=True, slots=True)
class Action:
    """One step of the nemesis's plan: at ``at`` seconds, a ``kind`` (``"pause"``, ``"kill"``,
    ``"freeze_holder"``: SIGSTOP it at work until a successor commits above it, ``"kill_in_tx"``:
    SIGKILL it only inside ``BEGIN IMMEDIATE``) of a ``worker`` (-1: the holder) for ``seconds``."""

    at: float
    kind: str
    worker: int
    seconds: float


def schedule(seed: int, *, workers: int, seconds: float, ttl: float) -> tuple[Action, ...]:
    """The nemesis's plan, a pure function of its arguments, sorted by time, its tempo slowed by
    ``ttl / TTL``: a holder freeze at 12-25% of the run, a kill in a transaction at 30-45%, then
    pauses (up to three leases, log-uniform), kills, freezes and kills in transactions until 70%."""
    rng, k = random.Random(seed), ttl / TTL
    first = round(seconds * rng.uniform(0.12, 0.25), 3)
    plan = [Action(first, "freeze_holder", -1, round(ttl * rng.uniform(3, 5), 3))]
    plan.append(Action(round(seconds * rng.uniform(0.3, 0.45), 3), "kill_in_tx", -1, 0.2 * k))
    at = 0.4 * k
    while (at := at + rng.expovariate(3.0 / k)) < 0.7 * seconds:
        kind = rng.choices(["pause", "kill", "freeze_holder", "kill_in_tx"], [12, 4, 1, 2])[0]
        if kind == "pause":
            length = 0.05 * k * math.exp(rng.uniform(0, math.log(3 * TTL / 0.05)))
            worker = rng.randrange(workers)
        elif kind == "kill":
            worker, length = rng.randrange(workers), k * rng.uniform(0.05, 0.5)
        else:  # the holder, whoever it is then
            worker, length = -1, (ttl * rng.uniform(3, 5) if kind == "freeze_holder" else 0.2 * k)
        plan.append(Action(round(at, 3), kind, worker, round(length, 3)))
    return tuple(sorted(plan, key=lambda a: a.at))


def run(
    workers=4,
    seconds=10.0,
    *,
    seed=0,
    protected=True,
    progress=None,
    root=None,
    issuer="sqlite",
    min_commits=0,
):
    """Start the workers, play the nemesis's plan, judge the history; return the summary and the
    exit status. ``workers``: 2 to 26; ``seconds``: 2 or more; ``progress``: a text stream for the
    progress line; ``root``: where to make the run's folder; ``issuer``: "sqlite" or "etcd".
    A run that has not done its job by ``seconds`` (a holder frozen past its lease, a kill inside
    a transaction, ``min_commits`` commits) goes on a second at a time, to three times as long:
    a slow machine gets the same run, later, not a thinner one."""
    workers = check_number(workers, "workers", integer=True, low=2, high=26)
    seconds = check_number(seconds, "seconds", low=2, high=86400)
    min_commits = check_number(min_commits, "min_commits", integer=True, low=0, high=10**6)
    ttl = 1 if issuer == "etcd" else TTL  # etcd grants whole seconds: all is played slower
    plan, k = schedule(seed, workers=workers, seconds=seconds, ttl=ttl), ttl / TTL
    options = dict(protected=protected, seed=seed, root=root, ttl=ttl, seconds=seconds)
    options.update(busy_timeout_ms=100, redeliver=0.1, work=(0.05 * k, 0.25 * k))
    options.update(hold=(0.005 * k, 0.03 * k), rest=(0.0, 0.1 * k))
    with for_chaos(issuer, seconds) as (etcd, killer), Team(workers, etcd=etcd, **options) as team:
        errors, ended = _play(team, plan, seconds, progress, killer, min_commits)
        for name in team.names:  # then let the workers end by themselves, for a while
            team.thaw(name)
        end = team.now() + 2 + 3 * ttl
        while any(map(team.alive, team.names)) and team.now() < end:
            time.sleep(0.02)
    history, c = team.history(), team.counts
    violations = Counter(v.kind for v in check(history, final=team.final()))
    warned = Counter(w.kind for w in warnings(history))  # timing discipline: never a failure
    found = ", ".join(f"{k} {n}" for k, n in sorted(violations.items()))
    timeline = os.path.join(team.run_dir, "timeline.png")
    params = {"protected": protected, "workers": workers, "ttl": ttl, "seed": seed}
    ax = draw(history, now=ended, title=f"chaos run: {found or 'no violation'}", params=params)
    Path(timeline).write_bytes(png(ax))
    mode = "protected" if protected else "UNPROTECTED (no fence, no keys)"
    lines = [
        f"labkit chaos: {workers} workers, {seconds:g} s, seed {seed}, {mode}; "
        f"nemesis plan {hashlib.sha256(repr(plan).encode()).hexdigest()[:12]}",
        *_table(Counter((e.action, e.outcome) for e in history), c),
    ]
    if ended > seconds:
        lines.append(f"slow machine: the run went on to {ended:g} s to do its job")
    ledger = ", ".join(f"{i} is {a} but its lines sum to {s}" for i, a, s in team.ledger())
    lines.append(f"ledger: {ledger or 'every invoice equals the sum of its charge lines'}")
    lines += [killer.text] if etcd else []
    lines.append(f"violations: {found or 'none'}")
    lines.append(f"warnings: {', '.join(f'{k} {n}' for k, n in sorted(warned.items())) or 'none'}")
    lines += [f"worker error: {e}" for e in errors]
    missing = {"no lease holder was frozen past its lease": c["freezes_past_lease"]}
    missing["no kill landed inside a transaction"] = c["kills_in_tx"]
    lines += [f"run incomplete: {what}" for what, done in missing.items() if not done]
    lines.append(f"timeline: {timeline}")
    incomplete = errors or not all(missing.values())
    return "\n".join(lines), 2 if incomplete else 1 if violations else 0


def _table(outcomes: Counter, c: Counter) -> list[str]:
    """The summary table: each action's outcomes, the writes and the nemesis's doings."""
    columns = ["ok", "rejected", "duplicate", "held", "lost", "busy"]
    lines = [f"{'':10}" + "".join(f"{o:>10}" for o in columns)]
    for action in ("acquire", "raise", "read", "write", "renew", "release"):
        lines.append(f"{action:10}" + "".join(f"{outcomes[action, o]:>10}" for o in columns))
    w = {o: outcomes["write", o] for o in ("ok", "rejected", "duplicate")}
    return [
        *lines,
        f"write attempts: {sum(w.values()) + c['kills_in_tx']}  committed: {w['ok']}  "
        f"rejected: {w['rejected']}  duplicates stopped: {w['duplicate']}  "
        f"killed inside BEGIN IMMEDIATE: {c['kills_in_tx']}",
        f"nemesis: {c['freezes']} freezes ({c['freezes_past_lease']} of a lease holder past "
        f"its lease), {c['kills']} kills ({c['kills_in_tx']} inside BEGIN IMMEDIATE), "
        f"{c['restarts']} restarts",
    ]


def _done(team: Team, min_commits: int) -> bool:
    """Whether the run did its job: a holder frozen past its lease, a kill inside a
    transaction, and ``min_commits`` commits."""
    c = team.counts
    lines = "SELECT count(*) FROM invoice_lines WHERE run = $1"
    commits = team.query(lines, (team.run,))[0][0]
    return bool(c["freezes_past_lease"] and c["kills_in_tx"]) and commits >= min_commits


def _play(team: Team, plan, seconds: float, progress, killer, min_commits=0):
    """Play ``plan`` until ``seconds`` (or later: see :func:`run`); return the errors of workers
    that exited by themselves, and when the run ended."""
    steps, spared, errors, shown = list(plan), {}, [], -1.0
    later = {}  # (team.thaw or team.start, name) -> when to do it
    long = None  # (name, generation, since, until): the holder frozen past its lease
    end, settled = seconds, False
    team.start()
    while (now := team.now()) < end:
        if not settled and now >= end - 0.5:  # extended while the job is not done
            settled = end >= 3 * seconds or _done(team, min_commits)
            end = end if settled else min(3 * seconds, end + 1.0)
            team.extend(end)
        if long is not None and now >= long[3]:
            name, generation, since, until = long
            if now >= min(2 * until - since, end - 0.3) or team.overtaken(generation):
                team.thaw(name)
                long, spared[name] = None, now + 1.0  # let it reach its stale write first
        for name, code in team.exited().items():
            if code != 0 or now < end - 0.5:
                errors.append(f"{name} exited with {code}; see {team.run_dir}/logs")
                later.setdefault((team.start, name), now)
        for hand, name in [key for key, at in later.items() if now >= at]:
            del later[hand, name]
            hand(name)
        while steps and steps[0].at <= now:
            step = steps.pop(0)
            name = team.names[step.worker] if step.worker >= 0 else None
            if name is None or spared.get(name, 0.0) > now or not team.alive(name):
                continue
            if step.kind == "pause" and (phase := team.freeze(name)) is not None:
                blocking = phase == IN_TX or team.lock_held()  # it blocks every writer
                length = min(step.seconds, TTL) if blocking else step.seconds
                later[team.thaw, name] = now + length
            elif step.kind == "kill":
                team.kill(name)
                later.pop((team.thaw, name), None)
                long = None if long and long[0] == name else long
                later[team.start, name] = now + step.seconds
        due = [a for a in plan if a.kind == "freeze_holder" and a.at <= now]
        if long is None and team.counts["freezes_past_lease"] < len(due):
            if caught := team.freeze_holder():
                long = (*caught, now, now + min(due[-1].seconds, max(end - now - 0.3, 0)))
        due = [a for a in plan if a.kind == "kill_in_tx" and a.at <= now]
        held = team.holder() if team.counts["kills_in_tx"] < len(due) else None
        if held and team.kill_if_in_tx(held[0]):
            later[team.start, held[0]] = now + due[-1].seconds
        killer(now)
        if progress is not None and now - shown >= 0.25:
            shown = _progress(team, now, end, progress)
        time.sleep(0.01)
    if progress is not None:
        _progress(team, end, end, progress)
        progress.write("\n")
    return errors, end


def _progress(team: Team, now: float, seconds: float, stream) -> float:
    commits = team.query("SELECT count(*) FROM invoice_lines WHERE run = $1", (team.run,))[0][0]
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
    parser = argparse.ArgumentParser("python -m labkit.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--seconds", type=float, default=10.0, help="run length (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the nemesis and the workers")
    parser.add_argument("--unprotected", action="store_true", help="write without fence and keys")
    parser.add_argument("--issuer", choices=("sqlite", "etcd"), default="sqlite", help="leases")
    parser.add_argument("--dir", help="where to make the run's folder (default: a temporary one)")
    parser.add_argument(
        "--min-commits", type=int, default=0, help="go on (to 3x --seconds) until this many commits"
    )
    args = parser.parse_args(argv)
    options = dict(seed=args.seed, root=args.dir, issuer=args.issuer, progress=sys.stderr)
    options.update(min_commits=args.min_commits)
    try:
        summary, code = run(args.workers, args.seconds, protected=not args.unprotected, **options)
    except BadArgument as exc:
        parser.error(str(exc))
    print(summary)
    return code
