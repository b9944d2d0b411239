"""Histories: what every worker tried and what the system answered; their checker and verdict.

:func:`check` reads only the answers the system gave (``ok`` means committed) and the order
and tokens of attempts; :func:`describe` words the result in one line. Outcomes by action
(:class:`Event` says what its fields mean):

* ``acquire``, ``renew``: ``ok``, ``held`` or ``lost``; ``release``: ``ok`` or ``lost``.
* :data:`EFFECTS`: ``ok``, ``rejected`` (a fence, lease check or CAS), ``duplicate`` (a key),
  ``crashed`` or ``aborted``.
* ``read`` (``ok``: saw ``target``'s committed state) and ``raise`` (``ok``: the fence committed
  at ``generation``) order a successor's first action and a writer's view; ``wait``, ``pause``,
  ``resume`` and ``crash`` are informational."""

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from labkit.errors import BadArgument, BadArgumentType, LabkitError
from labkit.fence import token

__all__ = ["Event", "Violation", "check", "describe", "EFFECTS", "VIOLATION_KINDS", "TICK"]

TICK = 0.5  # virtual seconds between a worker's retries of a locked database

EFFECTS = frozenset({"write", "email", "charge"})
VIOLATION_KINDS = (
    "stale_accepted",
    "lost_update",
    "duplicate_effect",
    "acted_after_expiry",
    "foreign_release",
)


@dataclass(frozen=True, slots=True)
class Event:
    """One attempt and its answer.

    Attributes:
        time: when the answer came (simulated or real seconds).
        worker: who tried, e.g. ``"A"``.
        action, outcome: what was tried and what the system answered (``"ok"``: it took effect).
        generation: the token the worker acted with (int or (epoch, n)), or None.
        key: the operation key, if any (idempotency), else None.
        target: what was leased or changed, e.g. ``"invoice-run"`` or ``"INV-1"``.
        until: for ``acquire``/``renew`` the authority's expiry; for ``pause`` its end.
        began: for an effect, when its transaction began, if before ``time`` (None: at ``time``)."""

    time: float
    worker: str
    action: str
    outcome: str
    generation: object = None
    key: str | None = None
    target: str | None = None
    until: float | None = None
    began: float | None = None


@dataclass(frozen=True, slots=True)
class Violation:
    """A broken safety property: its ``kind`` (see VIOLATION_KINDS), ``event`` and ``message``."""

    kind: str
    event: Event
    message: str


def _is_token(value) -> bool:
    try:
        token(value)
    except LabkitError:
        return False
    return True


_NOT_TOKEN = "not an int or an (epoch, counter) pair"


def _checked(history: Iterable[Event], final) -> list[Event]:
    """The events in time order (stable), after checking them and ``final``."""
    if isinstance(history, (str, bytes, Mapping)) or not hasattr(history, "__iter__"):
        kind = type(history).__name__
        raise BadArgumentType("history", f"must be an iterable of Event, got {kind}")
    events = list(history)
    for i, e in enumerate(events):
        if not isinstance(e, Event):
            raise BadArgumentType("history", f"event {i} must be an Event, got {type(e).__name__}")
        what = f"event {i} ({e.worker} {e.action}) has"
        times = {"time": e.time} | ({} if e.began is None else {"began": e.began})
        for field, t in times.items():
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                raise BadArgument("history", f"{what} {field} {t!r}, not a finite number")
        if e.generation is not None and not _is_token(e.generation):
            raise BadArgument("history", f"{what} generation {e.generation!r}, {_NOT_TOKEN}")
    if final is not None:
        if not isinstance(final, Mapping):
            kind = type(final).__name__
            raise BadArgumentType("final", f"must be a mapping {{target: generation}}, got {kind}")
        for target, value in final.items():
            if value is not None and not _is_token(value):
                raise BadArgument("final", f"{target!r} holds {value!r}, {_NOT_TOKEN}")
    return sorted(events, key=lambda e: e.time)


def check(history: Iterable[Event], final: Mapping[str, object] | None = None) -> list[Violation]:
    """Return every safety violation in ``history`` (empty for a clean history).

    One history is the story of ONE fenced job and ONE lease: the checker keeps a single highest
    committed token for all effects and one lease expiry per worker. ``final``, if given, is the
    committed state at the end, ``{target: generation}``. A malformed event or value raises
    ``BadArgumentType`` or ``BadArgument`` naming ``history`` or ``final``.

    Checks:
        stale_accepted: an effect committed with a token below one already committed.
        lost_update: a target's committed write replaced by a lower token, or by another worker
            whose last read of that target came before the write, or not what ``final`` holds.
        duplicate_effect: two committed effects with the same operation key.
        acted_after_expiry: an effect committed by a worker whose transaction began after its
            own lease ended (its last acquire or renew's ``until``, or its release) and before it
            acquired again. A transaction begun in time (or at the very instant of expiry, when
            the successor's grant is still racing it) may commit late: the fence orders it.
        foreign_release: a release or renewal that succeeded for a worker not holding the lease.

    >>> check([Event(0, "B", "write", "ok", 8, target="INV-1"),
    ...        Event(1, "A", "write", "ok", 7, target="INV-2")])[0].kind
    'stale_accepted'
    """
    events = _checked(history, final)
    found: list[Violation] = []
    highest = None  # highest committed token so far
    last_write: dict[str, tuple[int, Event]] = {}  # target -> (position, its last committed write)
    keys_done: dict[str, Event] = {}
    ended: dict[str, tuple] = {}  # worker -> (when, how) its own lease ends at the authority
    holder: dict[str, tuple] = {}  # lease target -> (worker, generation) of the live lease
    last_read: dict[tuple, int] = {}  # (worker, target) -> position of its last ok read

    def flag(kind: str, event: Event, message: str) -> None:
        found.append(Violation(kind, event, message))

    for i, e in enumerate(events):
        if e.outcome != "ok":
            continue
        if e.action == "read":
            last_read[e.worker, e.target] = i
        if e.action in ("acquire", "renew"):
            me = (e.worker, e.generation)
            if e.action == "renew" and holder.get(e.target, me) != me:
                flag(
                    "foreign_release",
                    e,
                    f"{e.worker} renewed generation {e.generation} "
                    f"while {holder[e.target][0]} held the lease",
                )
            holder[e.target] = me
            if e.action == "acquire":
                ended.pop(e.worker, None)
            if e.until is not None:
                ended[e.worker] = (e.until, "expired")
        elif e.action == "release":
            owner = holder.pop(e.target, None)
            if owner is not None and owner != (e.worker, e.generation):
                flag(
                    "foreign_release",
                    e,
                    f"{e.worker}'s release (generation {e.generation}) "
                    f"deleted {owner[0]}'s lease (generation {owner[1]})",
                )
            ended[e.worker] = (e.time, "was released")
        elif e.action in EFFECTS:
            if e.generation is not None:
                mine = token(e.generation)
                if highest is not None and mine < token(highest):
                    flag(
                        "stale_accepted",
                        e,
                        f"a {e.action} with generation {e.generation} "
                        f"was accepted after {highest} committed",
                    )
                if highest is None or mine > token(highest):
                    highest = e.generation
                at, before = last_write.get(e.target, (i, None))
                if before is not None and mine < token(before.generation):
                    flag(
                        "lost_update",
                        e,
                        f"{e.worker} (generation {e.generation}) overwrote "
                        f"{e.target} written by {before.worker} (generation {before.generation})",
                    )
                elif (
                    before is not None
                    and before.worker != e.worker
                    and last_read.get((e.worker, e.target), at) < at
                ):
                    flag(
                        "lost_update",
                        e,
                        f"{e.worker} overwrote {e.target} without having seen "
                        f"{before.worker}'s write (generation {before.generation}) "
                        f"that landed after its read",
                    )
                last_write[e.target] = (i, e)
            if e.key is not None:
                if e.key in keys_done:
                    flag(
                        "duplicate_effect",
                        e,
                        f"operation {e.key!r} took effect twice "
                        f"(at t={keys_done[e.key].time:g} and t={e.time:g})",
                    )
                keys_done.setdefault(e.key, e)
            end, how = ended.get(e.worker, (math.inf, ""))
            if (e.time if e.began is None else e.began) > end:
                flag(
                    "acted_after_expiry",
                    e,
                    f"{e.worker} committed a {e.action} at t={e.time:g}, "
                    f"after its lease {how} at t={end:g}",
                )
    for target, (_, e) in last_write.items() if final is not None else ():
        held = final.get(target)
        if held is None or token(held) != token(e.generation):
            flag(
                "lost_update",
                e,
                f"{target}: committed by {e.worker} with generation "
                f"{e.generation}, but the table holds {held}",
            )
    return found


_HEADLINE = ("lost_update", *(k for k in VIOLATION_KINDS if k != "lost_update"))  # worst first
_LABEL = {kind: kind.replace("_", " ") for kind in VIOLATION_KINDS}
_LABEL["stale_accepted"] = "stale write accepted"


def describe(history: Iterable[Event], violations: Iterable[Violation]) -> str:
    """One line: the worst violation, or for a clean run what stopped the failure
    (a stale write bounced off the fence, a repeat recognised by its key, a lock wait)."""
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
        repeat = f"{dup.worker}'s repeat of {dup.key!r}"
        return f"{repeat} was recognised by its key: it took effect once"
    n = sum(1 for e in history if e.action in EFFECTS and e.outcome == "ok")
    waits = [e for e in history if e.action == "wait"]
    if waits:
        who = waits[0].worker
        mine = [e.time for e in waits if e.worker == who]
        refused = ("renew", "lost") in {(e.action, e.outcome) for e in history if e.worker == who}
        then = "; by then its lease had ended, so it stopped" if refused else ", then went on"
        return (
            f"{who} waited {mine[-1] - mine[0] + TICK:g} s for the file's write lock{then}: "
            f"no violation, {n} committed writes in generation order"
        )
    return f"no violation: {n} committed writes, in generation order, none lost"
