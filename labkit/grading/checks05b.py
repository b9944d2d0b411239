"""Grading check of exercise 05, task 05.2 (registered in :mod:`labkit.grading`).

* 05.2 the holder loop, under a real :class:`~labkit.LeaseAuthority` while the network
  delays or loses renewals and successor B takes the lease the moment it expires.
"""

from __future__ import annotations

import math
from random import Random

from labkit.clock import VirtualClock
from labkit.grading import Schedule, expect, task
from labkit.grading.checks05 import _worst_case
from labkit.grading.lab import lease_event, scratch
from labkit.lease import LeaseAuthority
from labkit.sim.history import Event, check as violations, warnings


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
        self.rate = 1 + self.k["rate"] * self.k["max_drift"]  # rate in [1 - drift, 1 + drift]
        self.offset = self.rng.uniform(100, 10_000)  # a monotonic clock's origin
        self.authority = LeaseAuthority(db, self.true)
        self.lease, self.b_holds = None, False
        self.deadline = -math.inf  # the reference deadline from confirmed sends
        # idle: renewals since the last unit of work; reads: clock reads since time last passed;
        # unsure: the holder's last call was a renewal that was not confirmed
        self.units = self.done = self.renewals = self.idle = self.reads = self.unsure = 0
        self.first_late = None  # (local issue time, reference deadline) of the first late unit
        self.pause_at = self.k.get("pause_at")
        self.runaway = None

    def _stop(self, why: str):
        self.runaway = self.runaway or why  # remembered even if the loop swallows the exception
        raise _Runaway(self.runaway)

    # the holder's view
    def now(self) -> float:
        self.reads += 1
        if self.reads > 500 or self.runaway:
            self._stop(
                "the holder loop keeps reading the clock: time passes only in renew() and work()"
            )
        return self.offset + self.rate * self.true.now()

    def _draw(self, knob: str) -> float:
        return self.rng.uniform(*self.k[knob])

    def _advance(self, seconds: float) -> None:
        """Let true time pass; B takes the lease the moment A's expires."""
        end, self.reads = self.true.now() + seconds, 0
        if self.lease is not None and not self.b_holds and self.lease.expires_at <= end:
            self.true.advance(max(0.0, self.lease.expires_at - self.true.now()))
            b = self.authority.try_acquire(self.lease.name, "B", 1e6)
            if b is not None:
                self.b_holds, now = True, self.true.now()
                lease_event(self.history, now, b)
                self.history.append(
                    Event(now, "B", "write", "ok", b.generation, target="B's first unit")
                )
        self.true.advance(max(0.0, end - self.true.now()))

    def _confirm(self, sent_local: float) -> None:
        ttl, margin, drift = self.k["ttl"], self.k["margin"], self.k["max_drift"]
        self.deadline = max(self.deadline, _worst_case(sent_local, ttl, margin, drift))
        self.unsure = False

    def start(self, job: str) -> float:
        """Acquire A's lease (a hostile row's ``acquire`` and ``granted`` knobs time its legs)."""
        legs = ("acquire", "granted") if "acquire" in self.k else ("request", "response")
        sent = self.now()
        self._advance(self._draw(legs[0]))
        self.lease = self.authority.acquire(job, "A", self.k["ttl"])
        lease_event(self.history, self.true.now(), self.lease)
        self._advance(self._draw(legs[1]))
        self._confirm(sent)
        return sent

    def renew(self) -> bool:
        self.renewals, self.idle, self.unsure = self.renewals + 1, self.idle + 1, True
        if self.renewals > 50 * self.k["units"] + 200 or self.idle > 200 or self.runaway:
            self._stop("the holder loop keeps renewing without working or stopping")
        sent = self.now()
        self._advance(self._draw("request"))
        lost = self.rng.random() < self.k["loss"]
        try:
            new = self.authority.renew(self.lease)
        except Exception:  # LeaseLost: B has it now
            new = None
        outcome = "ok" if new else "lost"
        lease_event(self.history, self.true.now(), new or self.lease, "renew", outcome)
        self.lease = new or self.lease
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
        local, self.idle, self.unsure = self.now(), 0, False
        now = self.true.now()  # time passes only in _advance, below
        if local >= self.deadline and self.first_late is None:
            self.first_late = (local, self.deadline, now)
        unit = f"unit {self.done + 1}"
        self.history.append(Event(now, "A", "write", "ok", self.lease.generation, target=unit))
        self.done += 1
        seconds = self._draw("unit")
        if self.pause_at == self.done:
            seconds += self.k["pause"]
            self.history.append(Event(now, "A", "pause", "ok", until=now + seconds))
        self._advance(seconds)
        return self.done < self.k["units"]


def _holder_knobs(rng: Random) -> dict:
    ttl = rng.choice([5.0, 10.0, 20.0])
    trouble = rng.random() < 0.7
    pause_at = rng.choice([None, rng.randint(1, 9)]) if trouble else None
    return {
        "ttl": ttl,
        "margin": ttl * rng.uniform(0.05, 0.2),
        "max_drift": rng.choice([0.001, 0.01, 0.05]),
        "rate": rng.choice([-1, -1, 0, 1]),
        "units": rng.randint(10, 40),
        "unit": (0.02 * ttl, 0.1 * ttl),
        "request": (0.0, 0.3 * ttl if trouble else 0.05 * ttl),
        "response": (0.0, 0.9 * ttl if trouble else 0.05 * ttl),
        "loss": 0.3 if trouble else 0.0,
        "timeout": ttl * rng.uniform(0.2, 1.0),
        "pause_at": pause_at,
        "pause": 3 * ttl,
        "benign": not trouble,
    }


_QUICK = {
    "ttl": 10.0,
    "margin": 1.0,
    "max_drift": 0.01,
    "rate": -1,
    "units": 30,
    "unit": (0.2, 0.5),
    "request": (0.05, 0.2),
    "response": (0.05, 0.2),
    "loss": 0.0,
    "timeout": 3.0,
    "pause": 0.0,
    "pause_at": None,
    "benign": True,
}


def _trouble(name: str, **changes) -> dict:
    quick = {"acquire": _QUICK["request"], "granted": _QUICK["response"]}
    return {"name": name, **_QUICK, **quick, **changes, "benign": False}


GRANTED_LATE = "the grant comes late: the acquisition's answer spends 10-12 s in the network"
HOLDER_HOSTILE = [
    {"name": "every renewal is confirmed quickly (the job must get done)", **_QUICK},
    _trouble(
        "slow responses: each renewal's answer spends 6-8 s in the network", response=(6.0, 8.0)
    ),
    _trouble("confirmed too late: each answer spends 9-11 s in the network", response=(9.0, 11.0)),
    _trouble("every renewal's response is lost", loss=1.0),
    _trouble(
        "no margin to spare in small steps: responses lost, clock 5% slow",
        max_drift=0.05,
        margin=0.3,
        unit=(0.02, 0.05),
        loss=1.0,
        timeout=0.05,
        units=260,
    ),
    _trouble("the holder pauses 30 s inside its 5th unit of work", pause_at=5, pause=30.0),
    _trouble(
        "slow requests: the renewal reaches the authority after the lease ended",
        request=(9.0, 12.0),
    ),
    _trouble(GRANTED_LATE, granted=(10.0, 12.0)),
]


@task(
    "05.2",
    "the holder that stops at its deadline",
    HOLDER_HOSTILE,
    count=14,
    make=_holder_knobs,
    properties={
        "deadline": "no unit of work starts after the deadline of the last confirmed renewal",
        "finishes": "a holder whose renewals are confirmed quickly finishes the job",
        "ends": "the holder returns once the job is done or its deadline has passed unrenewed",
    },
)
def holder_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 05.2: ``answer(clock, renew, work, *, acquired_at, ttl, margin, max_drift)``."""
    k = schedule.knobs
    with scratch() as tmp:
        db = tmp.open()
        world = _HolderWorld(db, schedule, history)
        sent = world.start("invoice-run")

        class HolderClock:
            """The holder's own monotonic clock."""

            def now(self):
                return world.now()

        try:
            limits = {name: k[name] for name in ("ttl", "margin", "max_drift")}
            answer(HolderClock(), world.renew, world.work, acquired_at=sent, **limits)
        except _Runaway:
            pass
        if world.first_late is not None:
            local, deadline, true = world.first_late
            what = "with no confirmed lease, at"
            if deadline > -math.inf:
                what = f"{local - deadline:.3g} s after"
            passed = world.b_holds and true >= world.lease.expires_at
            expect(
                False,
                "no protected work starts after the conservative deadline of the last confirmed "
                "renewal (counted from that renewal's SEND time, minus margin and drift)",
                f"a unit of work started at local t={local:.6g}, {what} the deadline t={deadline:.6g}"
                + (" (the lease had already passed to B)" if passed else ""),
                prop="deadline",
            )
        found = (*violations(history), *warnings(history))  # discipline too
        late = [v for v in found if v.kind in ("acted_after_expiry", "stale_accepted")]
        if world.done and not late:  # held here, before finishes or ends ends the schedule
            expect(True, "no unit of work starts after the deadline", prop="deadline")
        if k["benign"]:
            rule = (
                "a holder whose renewals are all confirmed quickly renews in time and finishes "
                "the job"
            )
            stopped = f"it stopped after {world.done} of {k['units']} units"
            expect(world.done == k["units"], rule, stopped, prop="finishes")
        local = world.offset + world.rate * world.true.now()
        deadline = world.deadline
        over = world.done >= k["units"] or local >= deadline - 1e-9 * abs(deadline)
        if world.runaway or world.done:  # a holder that never worked is judged by nothing here
            expect(  # giving up at an unconfirmed renewal is stricter than needed, and allowed
                world.runaway is None and (over or world.unsure),
                "the holder loop ends: it returns when the job is done or when it may no longer "
                "act (its deadline has passed, or its last renewal was not confirmed)",
                world.runaway
                or f"it returned at local t={local:.6g}, before the deadline "
                f"t={deadline:.6g}, after {world.done} of {k['units']} units and no failed renewal",
                prop="ends",
            )
        if world.done:
            rule = "the holder never acts after its lease has passed to B"
            expect(not late, rule, late[0].message if late else "", prop="deadline")
