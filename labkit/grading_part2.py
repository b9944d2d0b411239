"""Grading checks for the exercises of lessons 05-09 (registered in :mod:`labkit.grading`).

Each trial builds the surrounding system from labkit's reference code (a real
SQLite file, :class:`~labkit.LeaseAuthority`, a :class:`~labkit.VirtualClock`),
runs the student's function inside it under one schedule, and judges what the
function DID: the rows left behind, the times at which protected work ran, the
emails that went out. Values the student cannot know in advance (names,
generations, timings, seeds) come from the schedule.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import tempfile

from .clock import VirtualClock
from .db import connect, execute
from .grading import Schedule, expect, schedules, task
from .history import Event, check as violations
from .lease import LeaseAuthority


def _connect(path: str):
    """A labkit connection that never waits for the lock, without fsync (a check needs no durability)."""
    db = connect(path, busy_timeout_ms=0)
    execute(db, "PRAGMA synchronous = OFF")
    return db


@contextlib.contextmanager
def _database():
    """A fresh labkit SQLite file (real file, WAL) and a second connection to it."""
    folder = tempfile.mkdtemp(prefix="labkit-check-")
    path = os.path.join(folder, "check.db")
    db, other = _connect(path), _connect(path)
    try:
        yield db, other
    finally:
        db.conn.close()
        other.conn.close()
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _between_statements(db, at: int, action):
    """Run ``action()`` just before the ``at``-th SQL statement the answer issues on ``db``.

    ``action`` runs on another connection, so it models a concurrent worker that
    acts between the answer's statements. It returns False when it could not run
    (the answer holds the write lock); the caller then runs it afterwards.
    """
    seen = {"n": 0, "done": False}

    def trace(_sql: str) -> None:
        seen["n"] += 1
        if seen["n"] == at and not seen["done"]:
            try:
                seen["done"] = bool(action())
            except Exception:  # busy: the answer's transaction keeps the world still
                seen["done"] = False

    db.conn.set_trace_callback(trace if at else None)
    try:
        yield seen
    finally:
        db.conn.set_trace_callback(None)


# ---------------------------------------------------------------- 05.1 deadline

def _worst_case(send_time: float, ttl: float, margin: float, max_drift: float) -> float:
    """The latest local time that still leaves ``margin`` before the earliest possible expiry."""
    return send_time + ttl * (1 - max_drift) - margin


def _deadline_knobs(rng: random.Random) -> dict:
    ttl = rng.choice([2.0, 5.0, 10.0, 30.0, 60.0, 120.0]) * rng.uniform(0.5, 1.5)
    return {"send_time": rng.choice([0.0, rng.uniform(0, 100), rng.uniform(1e3, 1e6)]), "ttl": ttl,
            "margin": ttl * rng.uniform(0.02, 0.3), "max_drift": rng.choice([1e-4, 1e-3, 0.01, 0.05, 0.2])}


DEADLINE_HOSTILE = [
    {"name": "the source's lease: 10 s, margin 1 s, clock up to 1% slow", "send_time": 100.0,
     "ttl": 10.0, "margin": 1.0, "max_drift": 0.01},
    {"name": "a perfect clock (no drift): only the margin", "send_time": 512.25, "ttl": 10.0,
     "margin": 0.5, "max_drift": 0.0},
    {"name": "no margin, a clock up to 5% slow: only the drift", "send_time": 7.5, "ttl": 30.0,
     "margin": 0.0, "max_drift": 0.05},
    {"name": "a monotonic clock that reads 843211.7 s (the holder's uptime)", "send_time": 843211.7,
     "ttl": 15.0, "margin": 2.0, "max_drift": 0.001},
    {"name": "a margin larger than the lease: no protected work at all", "send_time": 40.0,
     "ttl": 3.0, "margin": 5.0, "max_drift": 0.01},
]


@task("05.1", "the conservative local deadline", schedules(DEADLINE_HOSTILE, count=40, make=_deadline_knobs))
def deadline_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 05.1: ``answer(send_time, ttl, margin, max_drift) -> local deadline``."""
    k = schedule.knobs
    send, ttl, margin, drift = k["send_time"], k["ttl"], k["margin"], k["max_drift"]
    got = answer(send, ttl, margin, drift)
    expect(isinstance(got, (int, float)) and not isinstance(got, bool) and math.isfinite(got),
           "the deadline is a finite number (a time on the holder's clock)", f"it returned {got!r}")
    latest = _worst_case(send, ttl, margin, drift)   # request arrives at once, clock runs slowest
    # the world the check draws: the authority granted at the send, the holder's clock ran slow
    expiry_local = send + ttl * (1 - drift)
    history.append(Event(send, "A", "renew", "ok", 1, target="lease", until=send + ttl))
    history.append(Event(send + (got - send) / (1 - drift) if drift < 1 else got, "A", "write", "ok", 1,
                         target="last protected work"))
    history.append(Event(send + ttl, "B", "acquire", "ok", 2, target="lease", until=send + 2 * ttl))
    slack = 1e-9 * max(1.0, abs(send), ttl)
    expect(got <= max(latest, send) + slack,
           f"the deadline leaves the margin ({margin:g} s) before the earliest moment the lease can end "
           f"on the holder's clock, send_time + ttl*(1 - max_drift) = {expiry_local:.6g}, even when the request "
           "reached the authority at once and the holder's clock ran the slowest allowed",
           f"deadline({send:g}, ttl={ttl:g}, margin={margin:g}, max_drift={drift:g}) = {got:.6g}, "
           f"which leaves {expiry_local - got:.6g} s")
    if latest > send:
        expect(got >= latest - 0.01 * ttl - slack,
               "the deadline gives away no more of the lease than the margin and the drift require "
               f"(here it can be {latest:.6g})", f"it returned {got:.6g}")


# ---------------------------------------------------------------- 05.2 holder loop

class _Runaway(Exception):
    """Raised into a holder loop that keeps calling without letting time pass."""


class _HolderWorld:
    """The world of one 05.2 trial: an authority on real SQLite, a network, a successor B.

    True time is a :class:`VirtualClock`; the holder sees only its own clock,
    ``offset + rate * true``. Time passes only inside ``renew()`` and ``work()``.
    Whenever A's lease expires at the authority, B (who was waiting) takes it.
    """

    def __init__(self, db, schedule: Schedule, history: list) -> None:
        self.k, self.rng, self.history = schedule.knobs, schedule.rng, history
        self.true = VirtualClock(self.rng.uniform(0, 50))
        self.rate = 1 + self.k["rate"] * self.k["max_drift"]          # rate in [1 - drift, 1 + drift]
        self.offset = self.rng.uniform(100, 10_000)                      # a monotonic clock's origin
        self.authority = LeaseAuthority(db, self.true)
        self.lease = None
        self.b_holds = False
        self.deadline = -math.inf        # the reference deadline from confirmed sends
        self.units = self.done = self.renewals = self.calls = 0
        self.first_late = None           # (local issue time, reference deadline) of the first late unit
        self.pause_at = self.k.get("pause_at")
        self.runaway = None

    def _stop(self, why: str):
        self.runaway = self.runaway or why        # remembered even if the loop swallows the exception
        raise _Runaway(self.runaway)

    # the holder's view
    def now(self) -> float:
        self.calls += 1
        if self.calls > 200_000 or self.runaway:
            self._stop("the holder loop keeps reading the clock: time passes only in renew() and work()")
        return self.offset + self.rate * self.true.now()

    def _draw(self, knob: str) -> float:
        low, high = self.k[knob]
        return self.rng.uniform(low, high)

    def _advance(self, seconds: float) -> None:
        """Let true time pass; B takes the lease the moment A's expires."""
        end = self.true.now() + seconds
        if self.lease is not None and not self.b_holds and self.lease.expires_at <= end:
            self.true.advance(max(0.0, self.lease.expires_at - self.true.now()))
            b = self.authority.try_acquire(self.lease.name, "B", 1e6)
            if b is not None:
                self.b_holds = True
                self.history.append(Event(self.true.now(), "B", "acquire", "ok", b.generation,
                                          target=b.name, until=b.expires_at))
                self.history.append(Event(self.true.now(), "B", "write", "ok", b.generation,
                                          target="B's first unit"))
        self.true.advance(max(0.0, end - self.true.now()))

    def _confirm(self, sent_local: float) -> None:
        ttl, margin, drift = self.k["ttl"], self.k["margin"], self.k["max_drift"]
        self.deadline = max(self.deadline, _worst_case(sent_local, ttl, margin, drift))

    def start(self, job: str) -> float:
        sent = self.now()
        self._advance(self._draw("request"))
        self.lease = self.authority.acquire(job, "A", self.k["ttl"])
        self.history.append(Event(self.true.now(), "A", "acquire", "ok", self.lease.generation,
                                  target=job, until=self.lease.expires_at))
        self._advance(self._draw("response"))
        self._confirm(sent)
        return sent

    def renew(self) -> bool:
        self.renewals += 1
        if self.renewals > 50 * self.k["units"] + 200 or self.runaway:
            self._stop("the holder loop keeps renewing without working or stopping")
        sent = self.now()
        self._advance(self._draw("request"))
        lost = self.rng.random() < self.k["loss"]
        try:
            new = self.authority.renew(self.lease)
        except Exception:              # LeaseLost: B has it now
            new = None
        self.history.append(Event(self.true.now(), "A", "renew", "ok" if new else "lost",
                                  self.lease.generation, target=self.lease.name, until=new and new.expires_at))
        if new is not None:
            self.lease = new
        if lost:
            self._advance(self.k["timeout"])
            self.history.append(Event(self.true.now(), "A", "response", "lost", target="renew"))
            return False
        self._advance(self._draw("response"))
        if new is not None:
            self._confirm(sent)
        return new is not None

    def work(self) -> bool:
        if self.done >= self.k["units"] + 5 or self.runaway:
            self._stop("the holder loop keeps calling work() after it returned False")
        local = self.now()
        if local >= self.deadline and self.first_late is None:
            self.first_late = (local, self.deadline, self.true.now())
        self.history.append(Event(self.true.now(), "A", "write", "ok", self.lease.generation,
                                  target=f"unit {self.done + 1}"))
        self.done += 1
        seconds = self._draw("unit")
        if self.pause_at == self.done:
            seconds += self.k["pause"]
            self.history.append(Event(self.true.now(), "A", "pause", "ok", until=self.true.now() + seconds))
        self._advance(seconds)
        return self.done < self.k["units"]


def _holder_knobs(rng: random.Random) -> dict:
    ttl = rng.choice([5.0, 10.0, 20.0])
    trouble = rng.random() < 0.7
    pause_at = rng.choice([None, rng.randint(1, 9)]) if trouble else None
    return {"ttl": ttl, "margin": ttl * rng.uniform(0.05, 0.2), "max_drift": rng.choice([0.001, 0.01, 0.05]),
            "rate": rng.choice([-1, -1, 0, 1]), "units": rng.randint(10, 40),
            "unit": (0.02 * ttl, 0.1 * ttl), "request": (0.0, 0.3 * ttl if trouble else 0.05 * ttl),
            "response": (0.0, 0.9 * ttl if trouble else 0.05 * ttl), "loss": 0.3 if trouble else 0.0,
            "timeout": ttl * rng.uniform(0.2, 1.0), "pause_at": pause_at,
            "pause": 3 * ttl, "benign": not trouble}


_QUICK = {"ttl": 10.0, "margin": 1.0, "max_drift": 0.01, "rate": -1, "units": 30, "unit": (0.2, 0.5),
          "request": (0.05, 0.2), "response": (0.05, 0.2), "loss": 0.0, "timeout": 3.0, "pause": 0.0,
          "pause_at": None, "benign": True}
HOLDER_HOSTILE = [
    {"name": "every renewal is confirmed quickly (the job must get done)", **_QUICK},
    {"name": "slow responses: each renewal's answer spends 6-8 s in the network",
     **_QUICK, "response": (6.0, 8.0), "benign": False},
    {"name": "confirmed too late: each answer spends 9-11 s in the network", **_QUICK,
     "response": (9.0, 11.0), "benign": False},
    {"name": "every renewal's response is lost", **_QUICK, "loss": 1.0, "benign": False},
    {"name": "no margin to spare in small steps: responses lost, clock 5% slow", **_QUICK,
     "max_drift": 0.05, "margin": 0.3, "unit": (0.02, 0.05), "loss": 1.0, "timeout": 0.05, "units": 260,
     "benign": False},
    {"name": "the holder pauses 30 s inside its 5th unit of work", **_QUICK, "pause_at": 5, "pause": 30.0,
     "benign": False},
    {"name": "slow requests: the renewal reaches the authority after the lease ended", **_QUICK,
     "request": (9.0, 12.0), "benign": False},
]


@task("05.2", "the holder that stops at its deadline", schedules(HOLDER_HOSTILE, count=14, make=_holder_knobs))
def holder_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 05.2: ``answer(clock, renew, work, *, acquired_at, ttl, margin, max_drift)``."""
    k = schedule.knobs
    with _database() as (db, _):
        world = _HolderWorld(db, schedule, history)
        sent = world.start("invoice-run")

        class HolderClock:
            """The holder's own monotonic clock."""
            def now(self):
                return world.now()

        try:
            answer(HolderClock(), world.renew, world.work, acquired_at=sent,
                   ttl=k["ttl"], margin=k["margin"], max_drift=k["max_drift"])
        except _Runaway:
            pass
        expect(world.runaway is None, "the holder loop ends: it returns when the job is done or when it "
                                      "may no longer act", str(world.runaway))
        if world.first_late is not None:
            local, deadline, true = world.first_late
            what = (f"{local - deadline:.3g} s after" if deadline > -math.inf else "with no confirmed lease, at")
            expect(False, "no protected work starts after the conservative deadline of the last confirmed "
                          "renewal (counted from that renewal's SEND time, minus margin and drift)",
                   f"a unit of work started at local t={local:.6g}, {what} the deadline t={deadline:.6g}"
                   + (" (the lease had already passed to B)" if world.b_holds and
                      true >= world.lease.expires_at else ""))
        if k["benign"]:
            expect(world.done == k["units"], "a holder whose renewals are all confirmed quickly renews in time "
                                             "and finishes the job",
                   f"it stopped after {world.done} of {k['units']} units")
        late = [v for v in violations(history) if v.kind in ("acted_after_expiry", "stale_accepted")]
        expect(not late, "the holder never acts after its lease has passed to B", late[0].message if late else "")


# ---------------------------------------------------------------- 06.1 release

def _job(rng: random.Random) -> str:
    return rng.choice(["invoice-run", "report", "nightly", "billing"]) + f"-{rng.randrange(100)}"


def _release_knobs(rng: random.Random) -> dict:
    return {"story": rng.choice(["own", "successor", "same_owner_again", "race", "race", "two_names"]),
            "before": rng.randrange(0, 5), "inject_at": rng.randrange(1, 5)}


RELEASE_HOSTILE = [
    {"name": "A releases its own live lease", "story": "own", "before": 0, "inject_at": 0},
    {"name": "A's late release arrives after B took over", "story": "successor", "before": 6, "inject_at": 0},
    {"name": "A restarted and re-acquired; the old A's late release arrives",
     "story": "same_owner_again", "before": 2, "inject_at": 0},
    {"name": "someone else presents the holder's generation", "story": "foreign", "before": 3, "inject_at": 0},
    {"name": "A holds two leases with the same generation", "story": "two_names", "before": 0, "inject_at": 0},
    {"name": "nothing is held", "story": "nothing", "before": 1, "inject_at": 0},
    {"name": "B takes over just before the release's 1st statement", "story": "race", "before": 1, "inject_at": 1},
    {"name": "B takes over just before the release's 2nd statement", "story": "race", "before": 4, "inject_at": 2},
    {"name": "B takes over just before the release's 3rd statement", "story": "race", "before": 0, "inject_at": 3},
]


def _leases(db) -> list[tuple]:
    return execute(db, "SELECT name, owner, generation FROM leases ORDER BY name")


@task("06.1", "the owner-and-generation-checked release",
      schedules(RELEASE_HOSTILE, count=16, make=_release_knobs))
def release_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 06.1: ``answer(db, name, owner, generation) -> bool``."""
    rng, k, story = schedule.rng, schedule.knobs, schedule.knobs["story"]
    job, a, b = _job(rng), "A", "B"
    ttl = rng.choice([5, 10, 30])
    with _database() as (db, other):
        clock = VirtualClock(rng.randrange(0, 1000))
        authority = LeaseAuthority(other, clock)
        for _ in range(k["before"]):          # earlier holders: generations the answer cannot guess
            authority.release(authority.acquire(job, "earlier", ttl))
        mine = authority.acquire(job, a, ttl)
        history.append(Event(clock.now(), a, "acquire", "ok", mine.generation, target=job, until=mine.expires_at))
        caller, mine_row = a, (job, a, mine.generation)
        seen = {"present": None}

        def take_over(who: str) -> bool:
            seen["present"] = mine_row in _leases(other)
            clock.advance(ttl + 1)
            lease = authority.acquire(job, who, ttl)
            history.append(Event(clock.now(), who, "acquire", "ok", lease.generation,
                                 target=job, until=lease.expires_at))
            seen["counters"] = execute(other, "SELECT * FROM lease_counter ORDER BY name")
            return True

        if story in ("successor", "same_owner_again"):
            take_over(b if story == "successor" else a)
        elif story == "foreign":
            caller = b
        elif story == "two_names":
            for _ in range(k["before"]):
                authority.release(authority.acquire(job + "-archive", "earlier", ttl))
            extra = authority.acquire(job + "-archive", a, ttl)
            history.append(Event(clock.now(), a, "acquire", "ok", extra.generation, target=job + "-archive"))
        elif story == "nothing":
            authority.release(mine)
        seen["counters"], before = execute(db, "SELECT * FROM lease_counter ORDER BY name"), _leases(db)
        with _between_statements(db, k["inject_at"] if story == "race" else 0, lambda: take_over(b)) as race:
            got = answer(db, job, caller, mine.generation)
        history.append(Event(clock.now(), caller, "release", "ok" if got else "lost", mine.generation, target=job))
        expect(got in (True, False) and not isinstance(got, str),
               "the release answers True or False (did it delete the lease?)", f"it returned {got!r}")
        expect(execute(db, "SELECT * FROM lease_counter ORDER BY name") == seen["counters"],
               "a release never touches the permanent generation counter", "lease_counter changed")
        after = _leases(db)
        if story == "race" and race["done"]:        # B took over mid-release
            should = not seen["present"]               # True only if A's row was gone before B came
            expected = sorted([r for r in before if r[0] != job] + [(job, b, mine.generation + 1)])
        else:
            should = story in ("own", "two_names", "race")
            expected = [r for r in before if r != mine_row] if should else before
        what = _story(story, a, b) if story != "race" or race["done"] else f"{a} releases its own live lease"
        expect(bool(got) == should, f"the release answers {should} when {what}", f"it returned {got!r}")
        expect(after == expected, "the release deletes the caller's lease only, and only while owner "
                                  f"and generation both match ({what})", f"lease rows before {before}, after {after}")
        if story == "race" and not race["done"]:
            take_over(b)                                # B arrives after an undisturbed release
        found = [v for v in violations(history) if v.kind == "foreign_release"]
        expect(not found, "a late release never deletes another holder's lease", found[0].message if found else "")


def _story(story: str, a: str, b: str) -> str:
    return {"own": f"{a} releases its own live lease",
            "successor": f"{a}'s lease expired and {b} holds the next generation",
            "same_owner_again": f"{a} re-acquired with a newer generation after its old lease expired",
            "foreign": f"{b} presents {a}'s generation",
            "two_names": f"{a} also holds another lease with the same generation",
            "nothing": "nothing is held",
            "race": f"{b} took over between the release's statements"}[story]


# ---------------------------------------------------------------- 06.2 backoff

def _backoff_knobs(rng: random.Random) -> dict:
    return {"base": rng.choice([0.01, 0.05, 0.1, 0.25, 1.0]) * rng.randint(1, 4),
            "cap": rng.choice([1.0, 5.0, 30.0, 60.0]), "attempts": rng.randint(8, 40)}


BACKOFF_HOSTILE = [
    {"name": "base 0.1 s, cap 10 s", "base": 0.1, "cap": 10.0, "attempts": 30},
    {"name": "base 1 s, cap 2 s (the cap bites at once)", "base": 1.0, "cap": 2.0, "attempts": 12},
    {"name": "tiny base 0.003 s, cap 60 s, many attempts", "base": 0.003, "cap": 60.0, "attempts": 60},
]

SAMPLES = 60    # rng seeds per attempt


def _attempts(base: float, cap: float, count: int) -> list[int]:
    """The attempts worth checking: the growth phase, a few capped ones, and two large ones."""
    grow = next(a for a in range(2000) if base * 2 ** a >= cap)
    return list(range(min(count, grow + 3))) + [count + 20, 100]


@task("06.2", "jittered exponential backoff", schedules(BACKOFF_HOSTILE, count=6, make=_backoff_knobs))
def backoff_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 06.2: ``answer(attempt, *, base, cap, rng) -> seconds``."""
    k = schedule.knobs
    base, cap, attempts = k["base"], k["cap"], k["attempts"]
    seeds = [schedule.seed * 7919 + i for i in range(SAMPLES)]
    saved = random.getstate()
    try:
        for attempt in _attempts(base, cap, attempts):
            ceiling = min(cap, base * 2 ** attempt)
            random.seed(attempt * 31 + 1)
            first = [answer(attempt, base=base, cap=cap, rng=random.Random(s)) for s in seeds]
            random.seed(attempt * 31 + 2)
            again = [answer(attempt, base=base, cap=cap, rng=random.Random(s)) for s in seeds]
            if attempt < 6:                     # for the replay: one contender's waits
                t = history[-1].until if history else 0.0
                history.append(Event(t, "A", "acquire", "held", target="lease"))
                history.append(Event(t, "A", "wait", "ok", until=t + first[0]))
            expect(all(isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d)
                       for d in first), "a delay is a finite number of seconds", f"attempt {attempt}: {first[:3]}")
            expect(first == again, "the delay depends only on the arguments and the rng passed in "
                                   "(the same seed gives the same delay, whatever the global random does)",
                   f"attempt {attempt}: two runs with equal seeds gave {first[0]!r} and {again[0]!r}")
            low, high = min(first), max(first)
            expect(low >= 0 and high <= ceiling * (1 + 1e-9),
                   f"every delay lies in [0, min(cap, base * 2**attempt)] = [0, {ceiling:g}] at attempt {attempt}",
                   f"saw delays from {low:g} to {high:g}")
            expect(high - low >= 0.3 * ceiling,
                   f"delays are jittered: different rngs spread them over the range at attempt {attempt}",
                   f"{SAMPLES} rngs gave delays from {low:g} to {high:g} only")
            expect(high >= 0.8 * ceiling,
                   f"the delays reach up towards min(cap, base * 2**attempt) = {ceiling:g} at attempt {attempt} "
                   "(exponential growth, up to the cap)", f"the largest of {SAMPLES} delays was {high:g}")
    finally:
        random.setstate(saved)


# ---------------------------------------------------------------- 07.1 sweeper

def _sweep_knobs(rng: random.Random) -> dict:
    return {"jobs": rng.randint(3, 8), "mover": rng.choice(["checkpoint", "finish", "taken"]),
            "inject_at": rng.randrange(0, 5), "older_than": rng.choice([10.0, 30.0, 60.0])}


SWEEP_HOSTILE = [
    {"name": "old unfinished, fresh, finished and queued claims; nobody moves", "jobs": 6, "mover": None,
     "inject_at": 0, "older_than": 30.0},
    {"name": "B checkpoints progress just before the sweeper's 2nd statement", "jobs": 4,
     "mover": "checkpoint", "inject_at": 2, "older_than": 30.0},
    {"name": "B finishes its job just before the sweeper's 2nd statement", "jobs": 4, "mover": "finish",
     "inject_at": 2, "older_than": 30.0},
    {"name": "another sweeper requeues and C claims, before the sweeper's 2nd statement", "jobs": 4,
     "mover": "taken", "inject_at": 2, "older_than": 30.0},
    {"name": "B checkpoints just before the sweeper's 3rd statement", "jobs": 5, "mover": "checkpoint",
     "inject_at": 3, "older_than": 10.0},
    {"name": "B finishes just before the sweeper's 1st statement", "jobs": 3, "mover": "finish",
     "inject_at": 1, "older_than": 60.0},
]


def _claim_rows(db) -> dict:
    return {r[0]: r[1:] for r in execute(db, "SELECT job, owner, state, progress FROM claims ORDER BY job")}


@task("07.1", "the careful sweeper", schedules(SWEEP_HOSTILE, count=16, make=_sweep_knobs))
def sweep_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 07.1: ``answer(db, now, older_than) -> list of requeued jobs``."""
    from .recovery import Claims
    rng, k = schedule.rng, schedule.knobs
    older = k["older_than"]
    with _database() as (db, other):
        clock = VirtualClock(rng.uniform(1000, 5000))
        claims = Claims(other, clock)
        kinds = (["stale", "fresh", "done", "queued"] if k["jobs"] >= 4 else ["stale", "stale", "done"]) + [
            rng.choice(["stale", "stale", "fresh", "done", "queued"]) for _ in range(k["jobs"] - 4)]
        rng.shuffle(kinds)
        jobs = [f"run-{rng.randrange(10_000)}-{i}" for i in range(len(kinds))]
        for i, (job, kind) in enumerate(zip(jobs, kinds)):   # the old ones first, at old times
            if kind in ("stale", "done"):
                claims.enqueue(job)
                c = claims.claim(job, rng.choice("BDEF"), 7 + i)
                history.append(Event(clock.now(), c.owner, "acquire", "ok", c.generation, target=job))
                for _ in range(rng.randrange(0, 3)):
                    c = claims.checkpoint(c, c.progress + 1)
                if kind == "done":
                    claims.finish(c)
            clock.advance(rng.uniform(0.1, 1.0))
        clock.advance(older + rng.uniform(1, 20))
        for i, (job, kind) in enumerate(zip(jobs, kinds)):    # then the fresh ones
            if kind in ("fresh", "queued"):
                claims.enqueue(job)
                if kind == "fresh":
                    c = claims.claim(job, rng.choice("BDEF"), 20 + i)
                    claims.checkpoint(c, 1)
        clock.advance(rng.uniform(0.1, older / 2))
        now, before = clock.now(), _claim_rows(db)
        stale = [j for j, kind in zip(jobs, kinds) if kind == "stale"]
        moved = rng.choice(stale) if stale and k["mover"] else None

        def move() -> bool:
            c = claims.get(moved)
            if k["mover"] == "checkpoint":
                claims.checkpoint(c, c.progress + 1)
            elif k["mover"] == "finish":
                claims.finish(c)
            else:
                claims.requeue(c)
                claims.claim(moved, "C", 99)
            history.append(Event(clock.now(), c.owner if k["mover"] != "taken" else "C",
                                 "write", "ok", c.generation, target=f"{moved} ({k['mover']})"))
            seen["after"] = _claim_rows(other)[moved]
            return True

        seen = {"after": None}
        with _between_statements(db, k["inject_at"] if moved else 0, move) as race:
            got = answer(db, now, older)
        after = _claim_rows(db)
        expected = dict(before)
        for job in stale:
            if job == moved and race["done"]:
                expected[job] = seen["after"]
            else:
                expected[job] = (after[job][0] if after[job][1] == "queued" else before[job][0],
                                 "queued", before[job][2])
        requeued = sorted(j for j in stale if not (j == moved and race["done"]))
        for job in requeued:
            history.append(Event(now, "sweeper", "write", "ok" if after[job][1] == "queued" else "rejected",
                                 target=f"{job} requeued"))
        for job in jobs:
            what = {"stale": f"unfinished and untouched for more than {older:g} s",
                    "fresh": "recently updated by its owner", "done": "finished", "queued": "already queued"}
            kind = kinds[jobs.index(job)]
            if job == moved and race["done"]:
                story = f"it was old, but its owner {'moved it on' if k['mover'] != 'taken' else 'changed'} " \
                        f"({k['mover']}) while the sweeper ran"
                expect(after[job] == expected[job], "the sweeper never requeues a claim that moved on "
                                                    "after it was read", f"{job}: {story}; now {after[job]}")
            elif kind == "stale":
                expect(after[job][1:] == ("queued", before[job][2]),
                       "the sweeper requeues every old unfinished claim, keeping its progress",
                       f"{job} ({what[kind]}): before {before[job]}, after {after[job]}")
            else:
                expect(after[job] == before[job], f"the sweeper leaves a claim that is {what[kind]} alone",
                       f"{job}: before {before[job]}, after {after[job]}")
        expect(isinstance(got, (list, tuple, set)) and sorted(got) == requeued,
               "the sweeper returns the jobs it requeued", f"it returned {got!r}, requeued {requeued}")
        if moved and not race["done"]:
            move_after = claims.get(moved)
            expect(move_after.state == "queued", "the sweeper requeues every old unfinished claim",
                   f"{moved}: {move_after}")


# ---------------------------------------------------------------- 07.2 resume with operation ids

@contextlib.contextmanager
def _process(db, dies):
    """Run a worker on ``db`` whose process dies when ``dies(sql)`` first says so.

    ``dies`` is asked before every SQL statement. From that statement on,
    every statement on ``db`` is interrupted, so nothing more commits; the
    caller closes the connection afterwards, which rolls back what was open.
    """
    seen = {"dead": False}

    def trace(sql: str) -> None:
        if not seen["dead"] and dies(sql):
            seen["dead"] = True

    db.conn.set_trace_callback(trace)
    db.conn.set_progress_handler(lambda: 1 if seen["dead"] else 0, 1)
    try:
        yield seen
    finally:
        db.conn.set_trace_callback(None)
        db.conn.set_progress_handler(None, 1)


def _resume_knobs(rng: random.Random) -> dict:
    return {"units": rng.randint(3, 9), "every": rng.choice([2, 3, 4]),
            "dies_after": rng.choice([0, rng.randint(1, 8)]), "statement": rng.randint(1, 40)}


RESUME_HOSTILE = [
    {"name": "B dies just after its 4th invoice commits, before the checkpoint catches up", "units": 6,
     "every": 3, "dies_after": 4, "statement": 0},
    {"name": "B dies just after its 2nd invoice commits", "units": 5, "every": 4, "dies_after": 2, "statement": 0},
    {"name": "B dies at its 3rd SQL statement", "units": 4, "every": 2, "dies_after": 0, "statement": 3},
    {"name": "nobody dies", "units": 7, "every": 3, "dies_after": 0, "statement": 0},
]


@task("07.2", "resuming with operation ids", schedules(RESUME_HOSTILE, count=16, make=_resume_knobs))
def resume_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 07.2: ``answer(claims, claim, units, issue_invoice, *, every)``."""
    from .recovery import Claims
    rng, k = schedule.rng, schedule.knobs
    job = f"invoice-run-{rng.randrange(1000)}"
    units = [(f"c{i + 1}", rng.randrange(50, 500)) for i in range(k["units"])]
    with _database() as (admin, _):
        path = execute(admin, "PRAGMA database_list")[0][2]
        execute(admin, "CREATE TABLE issued (number INTEGER PRIMARY KEY AUTOINCREMENT, unit TEXT NOT NULL, "
                       "amount INTEGER NOT NULL, generation INTEGER NOT NULL)")
        clock = VirtualClock(rng.uniform(0, 100))
        desk = Claims(admin, clock)
        desk.enqueue(job)

        def issue_invoice(tx, unit, amount):
            """The billing effect: every call issues a NEW invoice number."""
            number = tx.execute("INSERT INTO issued(unit, amount, generation) VALUES (?, ?, ?) RETURNING number",
                                (unit, amount, tx.token[1]))[0][0]
            tx.execute("INSERT INTO invoices(job_id, invoice_id, amount, generation) VALUES (?, ?, ?, ?)",
                       (job, f"INV-{number}", amount, tx.token[1]))
            return number

        def issued() -> int:
            return execute(admin, "SELECT COUNT(*) FROM issued")[0][0]

        def run(owner: str, generation: int, dies_after: int, statement: int) -> bool:
            conn = _connect(path)
            claim = Claims(conn, clock).claim(job, owner, generation)
            history.append(Event(clock.now(), owner, "acquire", "ok", generation, target=job))
            start, count = issued(), {"sql": 0, "batches": []}

            def dies(sql: str) -> bool:
                count["sql"] += 1
                if sql.lstrip().upper().startswith("COMMIT"):
                    count["batches"].append(issued())
                return (statement and count["sql"] >= statement) or \
                    (dies_after and sql.lstrip().upper().startswith(("COMMIT", "BEGIN"))
                     and issued() - start >= dies_after)
            try:
                with _process(conn, dies) as fate:
                    try:
                        answer(Claims(conn, clock), claim, list(units), issue_invoice, every=k["every"])
                    except Exception:
                        if not fate["dead"]:
                            raise
            finally:
                conn.conn.close()
            for number, unit in execute(admin, "SELECT number, unit FROM issued WHERE number > ?", (start,)):
                history.append(Event(clock.now(), owner, "write", "ok", generation,
                                     key=f"{job}/{unit}", target=f"INV-{number} ({unit})"))
            if fate["dead"]:
                history.append(Event(clock.now(), owner, "crash", "ok"))
            after = desk.get(job)
            bumps = after.version - claim.version - (after.state == "done")
            todo = len(units) - claim.progress
            expect(bumps <= -(-todo // k["every"]) + 1,
                   f"progress is checkpointed at most once per {k['every']} units (checkpoints are costly)",
                   f"{owner} changed its claim {bumps} times for {todo} units")
            marks = count["batches"] + [issued()]
            expect(all(b - a <= 1 for a, b in zip(marks, marks[1:])),
                   "each invoice commits in its own fenced transaction", "one commit carried several invoices")
            return fate["dead"]

        died = run("B", 7, k["dies_after"], k["statement"])
        if died and desk.get(job).state != "done":
            clock.advance(60)
            expect(len(desk.sweep(older_than=30)) == 1,
                   "a crashed worker's unfinished claim stays claimed, for the sweeper to requeue",
                   f"the claim after the crash: {desk.get(job)}")
            run("C", 8, 0, 0)
        final = desk.get(job)
        counts = dict(execute(admin, "SELECT unit, COUNT(*) FROM issued GROUP BY unit"))
        twice = {u: n for u, n in counts.items() if n > 1}
        expect(not twice, "a retry never repeats an invoice that was already issued (one operation id per unit)",
               f"units invoiced more than once: {twice}" + (" after B died and C resumed" if died else ""))
        missing = [u for u, _ in units if u not in counts]
        expect(not missing, "every unit gets its invoice", f"missing: {missing}; the claim: {final}")
        expect(final.state == "done" and final.progress == len(units),
               "the job ends done, with its progress at the number of units", f"the claim: {final}")


# ---------------------------------------------------------------- 08.1 outbox relay

@contextlib.contextmanager
def _provider(admin):
    """A fake email provider with its own SQLite file next to ``admin``'s."""
    from .effects import EmailProvider
    path = os.path.join(os.path.dirname(execute(admin, "PRAGMA database_list")[0][2]), "provider.db")
    db = _connect(path)
    try:
        yield EmailProvider(db, VirtualClock())
    finally:
        db.conn.close()


class _Down(Exception):
    """The email provider could not be reached, or the relay died around the call."""


class _FlakyMail:
    """An :class:`~labkit.effects.EmailProvider` seen through a bad network.

    ``fail`` maps call numbers to ``"before"`` (the request never arrives) or
    ``"after"`` (the email goes out, the answer is lost and the caller dies).
    """

    kind = "email"

    def __init__(self, provider, fail: dict, fate: dict) -> None:
        self.provider, self.fail, self.fate, self.calls = provider, fail, fate, 0

    def send(self, to, subject, body, *, idempotency_key=None):
        """Send one email through the real provider, unless the network says otherwise."""
        self.calls += 1
        how = self.fail.get(self.calls)
        if self.fate["dead"] or how == "before":
            raise _Down("the email provider could not be reached")
        delivery = self.provider.send(to, subject, body, idempotency_key=idempotency_key)
        if how == "after":
            self.fate["dead"] = True
            raise _Down("the relay died before it saw the provider's answer")
        return delivery

    def deliver(self, payload, *, idempotency_key=None):
        """Like ``send``, with the payload as a dict (to, subject, body)."""
        return self.send(payload["to"], payload["subject"], payload["body"], idempotency_key=idempotency_key)


def _relay_knobs(rng: random.Random) -> dict:
    n = rng.randint(1, 5)
    return {"intents": n, "sent_before": rng.randint(0, n - 1), "charges": rng.randint(0, 1),
            "fail": {rng.randint(1, n + 1): rng.choice(["before", "after"]) for _ in range(rng.randint(0, 2))},
            "dies_at": rng.choice([0, 0, rng.randint(1, 12)])}


RELAY_HOSTILE = [
    {"name": "three emails, no trouble", "intents": 3, "sent_before": 0, "charges": 0, "fail": {}, "dies_at": 0},
    {"name": "the 1st send goes out but the relay dies before marking it", "intents": 2, "sent_before": 0,
     "charges": 0, "fail": {1: "after"}, "dies_at": 0},
    {"name": "the 2nd send never reaches the provider", "intents": 3, "sent_before": 0, "charges": 1,
     "fail": {2: "before"}, "dies_at": 0},
    {"name": "one email was relayed before; the 1st send now dies after delivering", "intents": 3,
     "sent_before": 1, "charges": 0, "fail": {1: "after"}, "dies_at": 0},
    {"name": "the relay dies at its 3rd SQL statement", "intents": 2, "sent_before": 0, "charges": 0,
     "fail": {}, "dies_at": 3},
]


def _publish_intents(admin, outbox, k, rng, job: str) -> tuple[list, list]:
    """B (generation 8) commits the email intents; stale A (7) tries too and is fenced out."""
    from .errors import StaleGeneration
    from .fence import Fence
    fence = Fence(admin, job)
    emails = [(f"{job}/report-{i}", {"to": rng.choice(["ops@example.com", "billing@example.com"]),
                                     "subject": f"run {job} report {i}", "body": f"total {rng.randrange(10**6)}"})
              for i in range(k["intents"])]
    with fence.guard(8) as tx:
        for key, email in emails:
            outbox.add(tx, key, "email", email)
        for c in range(k["charges"]):
            outbox.add(tx, f"{job}/charge-{c}", "charge", {"account": "acct-1", "amount": 100 + c})
    with contextlib.suppress(StaleGeneration), fence.guard(7) as tx:
        outbox.add(tx, f"{job}/stale-email", "email", {"to": "ops@example.com", "subject": "stale", "body": "A"})
    return emails, [key for key, _ in emails[:k["sent_before"]]]


@task("08.1", "the outbox relay", schedules(RELAY_HOSTILE, count=16, make=_relay_knobs))
def relay_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 08.1: ``answer(db, mail)`` sends pending email intents exactly once."""
    from .effects import Outbox
    rng, k = schedule.rng, schedule.knobs
    job = f"invoice-run-{rng.randrange(1000)}"
    with _database() as (admin, _), _provider(admin) as provider:
        clock = provider.clock = VirtualClock(rng.uniform(0, 100))
        outbox = Outbox(admin, clock)
        emails, sent_before = _publish_intents(admin, outbox, k, rng, job)
        for key, email in emails:
            if key in sent_before:         # relayed earlier by the reference relay
                outbox.mark_sent(key, provider.send(**email, idempotency_key=key).id)
        path = execute(admin, "PRAGMA database_list")[0][2]
        for runs in range(1, 7):            # the relay is restarted until one run goes through cleanly
            conn, statements = _connect(path), iter(range(1, 10**6))
            dies_at = k["dies_at"] if runs == 1 else 0
            try:
                with _process(conn, lambda sql: bool(dies_at) and next(statements) >= dies_at) as fate:
                    mail = _FlakyMail(provider, k["fail"] if runs == 1 else {}, fate)
                    try:
                        answer(conn, mail)
                    except Exception:
                        if not (fate["dead"] or mail.fail):
                            raise
            finally:
                conn.conn.close()
            history.append(Event(clock.now(), f"relay run {runs}", "crash" if fate["dead"] else "resume", "ok"))
            clock.advance(1)
            if not mail.fail and not fate["dead"]:
                break
        records = provider.records()
        for r in records:
            history.append(Event(r["created_at"], "relay", "email", "ok", key=r["idempotency_key"],
                                 target=r["payload"]["subject"]))
        for key, email in emails:
            n = sum(1 for r in records if r["payload"] == email)
            expect(n == 1, "every committed email intent is delivered exactly once, even when the relay dies "
                           "between sending and marking", f"{email['subject']!r} was delivered {n} times "
                           f"after {runs} relay runs")
        expect(len(records) == len(emails), "the relay sends only the committed email intents",
               f"{len(records)} emails for {len(emails)} intents: {[r['payload']['subject'] for r in records]}")
        states = dict(execute(admin, "SELECT key, state FROM outbox WHERE kind = 'email'"))
        expect(all(states[key] == "sent" for key, _ in emails),
               "after a clean relay run, every delivered intent is marked sent", f"outbox states: {states}")
        charges = execute(admin, "SELECT state FROM outbox WHERE kind = 'charge'")
        expect(all(s == "pending" for (s,) in charges), "the email relay leaves other kinds of intent alone",
               f"charge intents now {charges}")


# ---------------------------------------------------------------- 08.2 publish the report and the email intent

class _Dying:
    """Wraps an object; the worker dies at the ``at``-th call to any of ``names`` (shared ``count``)."""

    def __init__(self, inner, names: tuple, count: dict, at: int) -> None:
        self._inner, self._names, self._count, self._at = inner, names, count, at

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if name not in self._names or not callable(value):
            return value

        def call(*args, **kwargs):
            self._count["n"] += 1
            if self._at and self._count["n"] >= self._at:
                raise _Down(f"the worker died at its call to {name}()")
            return value(*args, **kwargs)
        return call


PUBLISH_HOSTILE = [
    {"name": "B (8) has raised the fence; stale A (7) wakes up and publishes before B does", "story": "early"},
    {"name": "B (8) publishes; then stale A (7) wakes up and publishes its own report", "story": "stale"},
    {"name": "B (8) publishes and dies; C (9) redoes the same step", "story": "redo"},
    {"name": "the worker dies at its first call to the email provider", "story": "mail_dies"},
    {"name": "the worker dies between its file write and its email intent", "story": "half"},
]


def _publish_knobs(rng: random.Random) -> dict:
    return {"story": rng.choice(["early", "stale", "redo", "mail_dies", "half"])}


@task("08.2", "the report and its email intent in one fenced transaction",
      schedules(PUBLISH_HOSTILE, count=8, make=_publish_knobs))
def publish_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 08.2: ``answer(generation, *, fence, files, outbox, mail, report, email)``."""
    from .effects import FencedFileStore, Outbox
    from .errors import StaleGeneration
    from .fence import Fence
    rng, story = schedule.rng, schedule.knobs["story"]
    job = f"invoice-run-{rng.randrange(1000)}"
    with _database() as (admin, _), _provider(admin) as provider:
        clock = provider.clock = VirtualClock(rng.uniform(0, 100))
        folder = tempfile.mkdtemp(prefix="labkit-files-")
        surprises: list[str] = []
        path = execute(admin, "PRAGMA database_list")[0][2]
        total = rng.randrange(10**6)

        def worker(name: str, generation: int, report: bytes, body: str, *, mail_at=0, store_at=0):
            conn = _connect(path)
            count = {"n": 0}
            fate = {"dead": False}
            files = _Dying(FencedFileStore(conn, folder, job), ("write",), count, store_at)
            outbox = _Dying(Outbox(conn, clock), ("add",), count, store_at)
            mail = _FlakyMail(provider, {1: "before"} if mail_at else {}, fate)
            sent_before = len(provider.records())
            outcome = "rejected"
            try:
                answer(generation, fence=Fence(conn, job), files=files, outbox=outbox, mail=mail,
                       report=report, email={"to": "ops@example.com", "subject": f"{job} report", "body": body})
            except NotImplementedError:
                raise
            except Exception as exc:   # stale, the planned death, or a surprise (judged at the end)
                if isinstance(exc, _Down):
                    outcome = "crashed"
                elif not isinstance(exc, StaleGeneration):
                    surprises.append(f"{name}: {type(exc).__name__}: {exc}")
            finally:
                conn.conn.close()
            if FencedFileStore(admin, folder, job).generation("report.txt") == generation:
                outcome = "ok"
            history.append(Event(clock.now(), name, "write", outcome, generation, target="report.txt"))
            for r in provider.records()[sent_before:]:
                history.append(Event(clock.now(), name, "email", "ok", generation, key=r["idempotency_key"],
                                     target=r["payload"]["subject"]))
            clock.advance(1)

        report_b, body_b = f"total {total}".encode(), f"the total is {total}"
        if story in ("stale", "early"):
            if story == "early":
                with Fence(admin, job).guard(8):
                    history.append(Event(clock.now(), "B", "raise", "ok", 8, target=job))
            else:
                worker("B", 8, report_b, body_b)
            worker("A", 7, b"total 0 (stale)", "the total is 0 (stale)")
            if story == "early":
                worker("B", 8, report_b, body_b)
        elif story == "redo":
            worker("B", 8, report_b, body_b)
            worker("C", 9, report_b, body_b)
        elif story == "mail_dies":
            worker("B", 8, report_b, body_b, mail_at=1)
        else:
            worker("B", 8, report_b, body_b, store_at=2)
        Outbox(admin, clock).relay(provider)          # the reference relay delivers what was committed
        files = FencedFileStore(admin, folder, job)
        content = files.read("report.txt")
        emails = [r["payload"]["body"] for r in provider.records()]
        for body in emails:
            history.append(Event(clock.now(), "relay", "email", "ok", target=body))
        shutil.rmtree(folder, ignore_errors=True)
        if story == "half":
            expect((content is None and emails == []) or (content == report_b and emails == [body_b]),
                   "the report file and its email intent commit together or not at all",
                   f"after the worker died: report file {content!r}, emails {emails}")
            expect(not surprises, "the answer runs without an unexpected error", "; ".join(surprises))
            return
        expect("the total is 0 (stale)" not in emails, "a stale worker's email never goes out (its intent "
                                                        "is fenced out with its file write)", f"emails: {emails}")
        expect(content == report_b, "the committed report is the current owner's",
               f"report.txt holds {content!r}")
        expect(emails == [body_b], "the committed report is announced by exactly one email, even when the "
                                   "step is redone or the worker dies at the email provider",
               f"emails sent: {emails}")
        expect(not surprises, "the answer runs without an unexpected error", "; ".join(surprises))


# ---------------------------------------------------------------- 09.1 pick the mechanism

MECHANISMS = ("lease", "fence", "idempotency key", "conservative deadline", "owner and generation check",
              "backoff with jitter", "durable claim and sweeper", "outbox", "new epoch")

#: incident -> (the mechanism, why, and why the usual wrong pick does not do it)
INCIDENTS = {
    "frozen-export": ("fence", "the worker that woke up was obsolete and wrote over its successor: only the "
                               "resource itself, refusing a lower generation, can stop a write that is already "
                               "on its way; a longer lease just needs a longer freeze"),
    "dead-holder": ("lease", "the holder died and nobody else could ever start: a time limit on the "
                             "permission is what lets a successor in"),
    "double-charge": ("idempotency key", "both charges carried the current, valid generation; a fence lets "
                                         "equal generations through, so only a key per operation stops the repeat"),
    "late-reply": ("conservative deadline", "the holder counted its lease from the reply's arrival; counting "
                                            "from the request's send time, minus a margin and the drift, would "
                                            "have stopped it before the authority moved on"),
    "stuck-release": ("owner and generation check", "a delayed release matched the owner name of the new "
                                                    "process; requiring the generation too makes it refuse"),
    "thundering-restart": ("backoff with jitter", "identical retry intervals keep contenders in lockstep; "
                                                  "growing, randomised waits spread them out"),
    "forgotten-run": ("durable claim and sweeper", "the lease let a successor in, but nobody knew work was "
                                                   "unfinished; a durable claim with progress and a sweeper that "
                                                   "requeues it conditionally makes recovery happen"),
    "stale-email": ("outbox", "the email provider cannot check generations; recording the email as an intent "
                              "inside the fenced transaction (and relaying it with a key) keeps the stale "
                              "worker's email from ever being sent"),
    "restored-counter": ("new epoch", "the restored counter handed out a number already used; a provably "
                                      "new epoch from a durable authority orders every later token above all "
                                      "the old ones"),
}


@task("09.1", "the right mechanism for each incident",
      schedules([{"name": f"incident {name}", "incident": name} for name in INCIDENTS], count=0,
                make=lambda rng: {}))
def incident_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 09.1: ``answer(incident) -> one of MECHANISMS``."""
    name = schedule.knobs["incident"]
    right, why = INCIDENTS[name]
    got = answer(name)
    picked = got.strip().lower() if isinstance(got, str) else got
    expect(picked in MECHANISMS, f"the answer for {name!r} is one of {MECHANISMS}", f"it returned {got!r}")
    expect(picked == right, f"incident {name!r} needs the {right}: {why}", f"you picked {got!r}")
