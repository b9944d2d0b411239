"""Grading checks of exercise 05 (registered in :mod:`labkit.grading`).

* 05.1 the conservative local deadline, against the worst case of drift and margin.
* 05.2, the holder loop, is checked in :mod:`labkit.grading.checks05b`.
"""

from __future__ import annotations

import math
from random import Random

from labkit.grading import NUMBER, Schedule, expect, hostile, task
from labkit.sim.history import Event


# ---------------------------------------------------------------- 05.1 deadline


def _worst_case(send_time: float, ttl: float, margin: float, max_drift: float) -> float:
    """The latest local time that still leaves ``margin`` before the earliest possible expiry."""
    return send_time + ttl * (1 - max_drift) - margin


def _deadline_knobs(rng: Random) -> dict:
    ttl = rng.choice([2.0, 5.0, 10.0, 30.0, 60.0, 120.0]) * rng.uniform(0.5, 1.5)
    return {
        "send_time": rng.choice([0.0, rng.uniform(0, 100), rng.uniform(1e3, 1e6)]),
        "ttl": ttl,
        "margin": ttl * rng.uniform(0.02, 0.3),
        "max_drift": rng.choice([1e-4, 1e-3, 0.01, 0.05, 0.2]),
    }


DEADLINE_HOSTILE = hostile(
    "send_time ttl margin max_drift",
    ("the lesson's lease: 10 s, margin 1 s, clock up to 1% slow", 100.0, 10.0, 1.0, 0.01),
    ("a perfect clock (no drift): only the margin", 512.25, 10.0, 0.5, 0.0),
    ("no margin, a clock up to 5% slow: only the drift", 7.5, 30.0, 0.0, 0.05),
    ("a monotonic clock that reads 843211.7 s (the holder's uptime)", 843211.7, 15.0, 2.0, 0.001),
    ("a margin larger than the lease: no protected work at all", 40.0, 3.0, 5.0, 0.01),
)


@task(
    "05.1",
    "the conservative local deadline",
    DEADLINE_HOSTILE,
    count=40,
    make=_deadline_knobs,
    returns=NUMBER,
    properties={
        "margin": "the deadline leaves the whole margin before the lease can end at the earliest",
        "tight": "the deadline gives away no more of the lease than margin and drift require",
    },
)
def deadline_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 05.1: ``answer(send_time, ttl, margin, max_drift) -> local deadline``."""
    send, ttl, margin, drift = map(schedule.knobs.get, ("send_time", "ttl", "margin", "max_drift"))
    got = answer(send, ttl, margin, drift)
    latest = _worst_case(send, ttl, margin, drift)  # request arrives at once, clock runs slowest
    # the world the check draws: the authority granted at the send, the holder's clock ran slow
    expiry_local = send + ttl * (1 - drift)
    history.append(Event(send, "A", "renew", "ok", 1, target="lease", until=send + ttl))
    number = isinstance(got, (int, float)) and math.isfinite(got)
    if number:
        last = send + (got - send) / (1 - drift) if drift < 1 else got
        history.append(Event(last, "A", "write", "ok", 1, target="last protected work"))
    history.append(Event(send + ttl, "B", "acquire", "ok", 2, target="lease", until=send + 2 * ttl))
    if not number:  # a time on the holder's clock
        expect(False, "the deadline is a finite number", f"it returned {got!r}", prop="margin")
    slack, shift = 1e-9 * max(1.0, abs(send), ttl), 1000.0 * max(1.0, ttl)
    # a rule kept by a do-nothing answer is no evidence: only a deadline after the send, moving with it
    moved = answer(send + shift, ttl, margin, drift) if got > send + slack else None
    acted = isinstance(moved, (int, float)) and abs(moved - shift - got) <= 1e-6 * (send + shift)
    ok, tight = got <= max(latest, send) + slack, got >= latest - 0.01 * ttl - slack
    if got > min(send, latest - slack) and (acted or not ok):  # no work started: any margin kept
        expect(
            ok,
            f"the deadline leaves the margin ({margin:g} s) before the earliest moment the lease can end "
            f"on the holder's clock, send_time + ttl*(1 - max_drift) = {expiry_local:.6g}, even when the request "
            "reached the authority at once and the holder's clock ran the slowest allowed",
            f"deadline({send:g}, ttl={ttl:g}, margin={margin:g}, max_drift={drift:g}) = {got:.6g}, "
            f"which leaves {expiry_local - got:.6g} s",
            prop="margin",
        )
    if latest > send and (acted or not tight):
        expect(
            tight,
            "the deadline gives away no more of the lease than the margin and the drift require "
            f"(here it can be {latest:.6g})",
            f"it returned {got:.6g}",
            prop="tight",
        )
