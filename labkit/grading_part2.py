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


@contextlib.contextmanager
def _database():
    """A fresh labkit SQLite file (real file, WAL) and a second connection to it."""
    folder = tempfile.mkdtemp(prefix="labkit-check-")
    path = os.path.join(folder, "check.db")
    db, other = connect(path, busy_timeout_ms=0), connect(path, busy_timeout_ms=0)
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
     "max_drift": 0.05, "margin": 0.3, "unit": (0.02, 0.05), "loss": 1.0, "timeout": 0.05, "units": 400,
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
        late = [v for v in violations(history) if v.kind == "acted_after_expiry"]
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
      schedules(RELEASE_HOSTILE, count=24, make=_release_knobs))
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
