"""The verdict: one line a student can read, made only from a history and its violations."""

from __future__ import annotations

from typing import Iterable

from labkit.sim.history import EFFECTS, VIOLATION_KINDS, Event, Violation
from labkit.sim.worker import TICK

__all__ = ["describe"]

_HEADLINE = ("lost_update", *(k for k in VIOLATION_KINDS if k != "lost_update"))  # worst first
_LABEL = {kind: kind.replace("_", " ") for kind in VIOLATION_KINDS}
_LABEL["stale_accepted"] = "stale write accepted"


def describe(history: Iterable[Event], violations: Iterable[Violation]) -> str:
    """One line: the worst violation, or for a clean run what stopped the failure
    (a stale write bounced off the fence, a repeat recognised by its key, a lock wait).

    Example:
        >>> from labkit.sim.history import Event
        >>> describe([Event(0.0, "A", "write", "ok", 7, None, "INV-1", None)], [])
        'no violation: 1 committed writes, in generation order, none lost'
    """
    violations = list(violations)
    if violations:
        worst = min(violations, key=lambda v: _HEADLINE.index(v.kind))
        same = sorted({v.kind for v in violations if v.event == worst.event}, key=_HEADLINE.index)
        message = worst.message
        if "acted_after_expiry" in same and worst.kind != "acted_after_expiry":
            message += ", after its lease expired"
        others = len({id(v.event) for v in violations if v.event != worst.event})
        more = f" (and {others} more)" if others else ""
        return f"{message}: {', '.join(_LABEL[k] for k in same)}{more}"
    history = list(history)
    fence = None
    for e in history:
        if e.action == "raise" and e.outcome == "ok":
            fence = e.generation
        elif e.action in EFFECTS and e.outcome == "rejected":
            at = f" at {fence}" if fence is not None else ""
            stale = f"{e.worker}'s stale {e.action} with {e.generation}"
            return f"{stale} bounced off the fence{at}: nothing lost"
    dup = next((e for e in history if e.outcome == "duplicate"), None)
    if dup is not None:
        return (
            f"{dup.worker}'s repeat of {dup.key!r} was recognised by its key: it took effect once"
        )
    n = sum(1 for e in history if e.action in EFFECTS and e.outcome == "ok")
    waits = [e for e in history if e.action == "wait"]
    if waits:
        who = waits[0].worker
        mine = [e.time for e in waits if e.worker == who]
        return (
            f"{who} waited {mine[-1] - mine[0] + TICK:g} s for the write lock, then went on: "
            f"no violation, {n} committed writes in generation order"
        )
    return f"no violation: {n} committed writes, in generation order, none lost"
