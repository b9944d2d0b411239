"""Histories: what every worker tried and what the system answered; their checker and verdict.

Two words, kept apart. A **violation** is what the data shows: a stale write accepted, a lost
update, a duplicate effect, two holders' effects interleaved, a lease freed by a non-holder. A
**warning** is timing discipline (acting after one's own lease ended): never unsafe by itself.

:func:`check` finds the violations, :func:`warnings` the warnings; both read only the answers
the system gave (``ok`` means committed) and the order and tokens of attempts; :func:`describe`
words the result in one line. Outcomes by action
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

__all__ = ["Event", "Violation", "TimingWarning", "check", "warnings", "describe", "EFFECTS"]
__all__ += ["VIOLATION_KINDS", "WARNING_KINDS", "TICK"]

TICK = 0.5  # virtual seconds between a worker's retries of a locked database

EFFECTS = frozenset({"write", "email", "charge"})
VIOLATION_KINDS = (
    "stale_accepted",
    "lost_update",
    "duplicate_effect",
    "interleaved",
    "foreign_release",
)
WARNING_KINDS = ("acted_after_expiry",)


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
    """Harm the data shows: its ``kind`` (see VIOLATION_KINDS), ``event`` and ``message``.

    ``event`` is the write that caused the harm (for an unseen overwrite by the rightful holder,
    the stale write that landed in its gap)."""

    kind: str
    event: Event
    message: str


@dataclass(frozen=True, slots=True)
class TimingWarning:
    """A lapse of timing discipline: its ``kind`` (see WARNING_KINDS), ``event``, ``message``."""

    kind: str
    event: Event
    message: str


def _is_token(value) -> bool:
    try:
        return token(value) is not None
    except LabkitError:
        return False


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


def _lease_ends(events: list[Event]) -> Iterable[tuple[Event, float, str]]:
    """Each event, with when and how its worker's own lease ends at the authority by then (its
    last acquire or renew's ``until``, or its release; inf if none)."""
    ended: dict[str, tuple] = {}
    for e in events:
        if e.outcome == "ok":
            if e.action == "acquire":
                ended.pop(e.worker, None)
            if e.action in ("acquire", "renew") and e.until is not None:
                ended[e.worker] = (e.until, "expired")
            elif e.action == "release":
                ended[e.worker] = (e.time, "was released")
        yield (e, *ended.get(e.worker, (math.inf, "")))


def _late(e: Event, end: float) -> bool:
    """Whether effect ``e`` began after its worker's own lease ended at ``end``."""
    return (e.time if e.began is None else e.began) > end


def check(history: Iterable[Event], final: Mapping[str, object] | None = None) -> list[Violation]:
    """Return every safety violation in ``history``: what the data shows (empty if clean).

    Timing alone is never a violation: that is :func:`warnings`.

    One history is ONE fenced job and ONE lease: a single highest committed token for all effects.
    ``final``, if given, is the committed state at the end, ``{target: generation}``. A malformed
    event or value raises ``BadArgumentType`` or ``BadArgument`` naming ``history`` or ``final``.

    Checks:
        stale_accepted: an effect committed with a token below one already committed.
        lost_update: a target's committed write replaced by a lower token, or by another worker
            whose last read of that target came before the write, or not what ``final`` holds.
            The violation names the write that caused it: the stale one (from a worker past its
            own lease) that landed in the gap, if the overwrite came from the rightful holder.
        duplicate_effect: two committed effects with the same operation key.
        interleaved: an effect committed by a worker after another worker's effect with a token
            at least as high, itself after the first worker's earlier effect: two holders acted
            at once (reported only where no other violation names the effect).
        foreign_release: a release or renewal that succeeded for a worker not holding the lease.

    >>> check([Event(0, "B", "write", "ok", 8, target="INV-1"),
    ...        Event(1, "A", "write", "ok", 7, target="INV-2")])[0].kind
    'stale_accepted'
    """
    events = _checked(history, final)
    found: list[Violation] = []
    highest = None  # highest committed token so far
    last_write: dict[str, tuple[int, Event, bool]] = {}  # target -> (position, write, was it late)
    keys_done: dict[str, Event] = {}
    holder: dict[str, tuple] = {}  # lease target -> (worker, generation) of the live lease
    last_read: dict[tuple, int] = {}  # (worker, target) -> position of its last ok read
    acted: list[tuple[int, Event]] = []  # committed effects with a token, in order

    def flag(kind: str, event: Event, message: str) -> None:
        found.append(Violation(kind, event, message))

    for i, (e, end, _) in enumerate(_lease_ends(events)):
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
        elif e.action == "release":
            owner = holder.pop(e.target, None)
            if owner is not None and owner != (e.worker, e.generation):
                flag(
                    "foreign_release",
                    e,
                    f"{e.worker}'s release (generation {e.generation}) "
                    f"deleted {owner[0]}'s lease (generation {owner[1]})",
                )
        elif e.action in EFFECTS:
            before_found = len(found)
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
                at, before, stale = last_write.get(e.target, (i, None, False))
                unseen = last_read.get((e.worker, e.target), at) < at  # its last read came before
                if before is not None and mine < token(before.generation):
                    flag(
                        "lost_update",
                        e,
                        f"{e.worker} (generation {e.generation}) overwrote "
                        f"{e.target} written by {before.worker} (generation {before.generation})",
                    )
                elif before is not None and before.worker != e.worker and unseen:
                    if stale and not _late(e, end):  # the stale write landed in the gap
                        flag(
                            "lost_update",
                            before,
                            f"{before.worker}'s late write of {e.target} (generation "
                            f"{before.generation}) landed between {e.worker}'s read and its "
                            f"write, and {e.worker} overwrote it unseen",
                        )
                    else:
                        flag(
                            "lost_update",
                            e,
                            f"{e.worker} overwrote {e.target} without having seen "
                            f"{before.worker}'s write (generation {before.generation}) "
                            f"that landed after its read",
                        )
                last_write[e.target] = (i, e, _late(e, end))
                mine_before = [j for j, x in acted if x.worker == e.worker]
                others = [x for j, x in acted if mine_before and j > mine_before[-1]]
                rivals = [x for x in others if x.worker != e.worker and token(x.generation) >= mine]
                rival = rivals[0] if rivals else None
                if rival is not None and len(found) == before_found:
                    flag(
                        "interleaved",
                        e,
                        f"{e.worker}'s {e.action} with generation {e.generation} came after "
                        f"{rival.worker}'s with {rival.generation}: two holders acted at once",
                    )
                acted.append((i, e))
            if e.key is not None:
                if e.key in keys_done:
                    flag(
                        "duplicate_effect",
                        e,
                        f"operation {e.key!r} took effect twice "
                        f"(at t={keys_done[e.key].time:g} and t={e.time:g})",
                    )
                keys_done.setdefault(e.key, e)
    for target, (_, e, _) in last_write.items() if final is not None else ():
        held = final.get(target)
        if held is None or token(held) != token(e.generation):
            flag(
                "lost_update",
                e,
                f"{target}: committed by {e.worker} with generation "
                f"{e.generation}, but the table holds {held}",
            )
    return found


def warnings(history: Iterable[Event]) -> list[TimingWarning]:
    """Return every lapse of timing discipline in ``history``: never a violation by itself.

    acted_after_expiry: an effect whose transaction began after its worker's own lease ended
    (see :func:`_lease_ends`); whether that harmed anything is :func:`check`'s to say.

    >>> [w.kind for w in warnings([Event(0, "A", "acquire", "ok", 7, target="run", until=10),
    ...                            Event(30, "A", "write", "ok", 7, target="INV-1")])]
    ['acted_after_expiry']
    """
    return [
        TimingWarning(
            "acted_after_expiry",
            e,
            f"{e.worker} committed a {e.action} at t={e.time:g}, "
            f"after its lease {how} at t={end:g}",
        )
        for e, end, how in _lease_ends(_checked(history, None))
        if e.outcome == "ok" and e.action in EFFECTS and _late(e, end)
    ]


_HEADLINE = ("lost_update", *(k for k in VIOLATION_KINDS if k != "lost_update"))  # worst first
_LABEL = {kind: kind.replace("_", " ") for kind in VIOLATION_KINDS}
_LABEL["stale_accepted"] = "stale write accepted"


def describe(history: Iterable[Event], violations: Iterable[Violation], warned=None) -> str:
    """One line: the worst violation, or for a clean run what stopped the failure (a stale write
    bounced off the fence, a repeat recognised by its key, a lock wait), then any warnings
    (``warned``; by default :func:`warnings` of ``history``)."""
    history, violations = list(history), list(violations)
    warned = warnings(history) if warned is None else list(warned)
    late = {id(w.event) for w in warned}
    if violations:
        worst = min(violations, key=lambda v: _HEADLINE.index(v.kind))
        same = sorted({v.kind for v in violations if v.event == worst.event}, key=_HEADLINE.index)
        message = worst.message + (", after its lease expired" if id(worst.event) in late else "")
        others = len({id(v.event) for v in violations if v.event != worst.event})
        more = f" (and {others} more)" if others else ""
        return f"{message}: {', '.join(_LABEL[k] for k in same)}{more}"
    clean = _clean(history)
    if not warned:
        return clean
    return f"{clean}; {len(warned)} warning{'s' * (len(warned) > 1)}: {warned[0].message}"


def _clean(history: list) -> str:  # the one line of a run without violations
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
