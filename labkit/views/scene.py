"""What one run's timeline shows, as plain coordinates, and the styles it is drawn with.

:func:`scene` turns a Result's history and violations into a :class:`Scene`, which
:func:`labkit.views.plot.timeline` and the panel's renderer both draw. Colours are
Okabe-Ito (distinct for the common colour blindnesses); each kind of write has its own marker.
"""

from dataclasses import dataclass

import matplotlib as mpl

from labkit.fence import token
from labkit.sim.history import EFFECTS

__all__ = ["Scene", "scene", "styles", "COLOURS", "SPAN_STYLES", "LABEL_STYLES"]

#: Okabe-Ito colours, by meaning
COLOURS = {
    "lease": "#56B4E9",
    "expiry": "#0072B2",
    "fence": "#0072B2",
    "wait": "#F0E442",
    "accepted": "#009E73",
    "overwritten": "#CC79A7",
    "rejected": "#D55E00",
    "duplicate": "#E69F00",
    "read": "#7f7f7f",
    "crash": "#000000",
}
SPAN_STYLES = {
    "lease": dict(facecolor=COLOURS["lease"], alpha=0.45, linewidth=0),
    "pause": dict(facecolor="white", edgecolor="#444444", hatch="///"),
    "wait": dict(facecolor=COLOURS["wait"], edgecolor="#444444", hatch=".."),
}
LABEL_STYLES = {
    "target": dict(fontsize="x-small", ha="center"),
    "pause": dict(fontsize="x-small", color="#333333", va="center"),
    "other": dict(fontsize="x-small", color="#333333", va="top"),
    "fence": dict(fontsize="small", color=COLOURS["fence"], fontweight="bold"),
    "note": dict(fontsize="small", color="#555555", va="center"),
}
_MAX_LANES = 14  # a herd of 100 shows its 14 busiest workers; the caption counts the rest
_QUIET = set("read acquire renew release wait pause resume crash raise response".split())


def styles() -> dict:
    """Marker styles by name, sized from the current ``lines.markersize`` (so presenter mode applies)."""
    size = mpl.rcParams["lines.markersize"]
    write = dict(ms=size * 1.3, mew=0.8, zorder=5)
    return {
        "read": dict(marker="v", color=COLOURS["read"], ms=size * 0.8),
        "held": dict(marker=".", color="#aaaaaa", ms=size * 0.8),
        "crash": dict(marker="*", color=COLOURS["crash"], ms=size * 1.5),
        "lost": dict(marker="d", mfc="white", mec=COLOURS["crash"], mew=1.2, ms=size * 1.1),
        "other": dict(marker="|", color="#333333", ms=size * 1.6, mew=1.5),
        "accepted": dict(marker="o", color=COLOURS["accepted"], mec="white", **write),
        "overwritten": dict(marker="s", color=COLOURS["overwritten"], mec="white", **write),
        "rejected": dict(marker="X", color=COLOURS["rejected"], mec="white", **write),
        "duplicate": dict(marker="P", color=COLOURS["duplicate"], mec="white", **write),
        "crashed": dict(marker="x", color=COLOURS["crash"], mec=COLOURS["crash"], **write),
        "violation": dict(
            marker="o", mfc="none", mec=COLOURS["crash"], mew=2, ms=size * 2.2, zorder=6
        ),
    }


def lanes_of(history) -> list[str]:
    """The workers in order of appearance; beyond 14, only those that did something that counted."""
    workers = list(dict.fromkeys(e.worker for e in history))
    if len(workers) <= _MAX_LANES:
        return workers
    busy = {e.worker for e in history if e.outcome == "ok" and e.action != "read"}
    return [w for w in workers if w in busy][:_MAX_LANES]


def end_of(history) -> float:
    """The last moment a run shows: its last event or the end of its last pause (at least 1)."""
    pauses = [e.until for e in history if e.until is not None and e.action == "pause"]
    return max([e.time for e in history] + pauses + [1.0])


def _intervals(events, tick: float = 0.5):
    """Lease-held intervals, pauses and waits of one worker's events, plus its expiries."""
    leases, pauses, waits, released = [], [], [], set()
    start = until = wait_from = None
    for e in events:
        if e.action == "wait":
            wait_from = e.time if wait_from is None else wait_from
            continue
        if wait_from is not None:
            waits.append((wait_from, max(e.time, wait_from + tick)))
            wait_from = None
        ok = e.outcome == "ok"
        if e.action == "acquire" and ok:
            if start is not None:
                leases.append((start, min(until, e.time)))
            start, until = e.time, e.until if e.until is not None else e.time
        elif e.action == "renew" and ok and start is not None and e.until is not None:
            until = e.until
        elif e.action == "release" and ok and start is not None:
            if e.time < until:
                until = e.time
                released.add(until)
            leases.append((start, until))
            start = None
        elif e.action == "pause":
            end = e.until if e.until is not None else e.time
            crashes = (c.time for c in events if c.action == "crash" and e.time <= c.time < end)
            pauses.append((e.time, next(crashes, end), e.target))
    if wait_from is not None:
        waits.append((wait_from, wait_from + tick))
    if start is not None:
        leases.append((start, until))
    return leases, pauses, waits, sorted({end for _, end in leases if end not in released})


def _write_kind(e, later) -> str:
    if e.outcome == "ok":
        replaced = any(
            o.target == e.target and o.worker != e.worker and o.outcome == "ok" for o in later
        )
        return "overwritten" if replaced else "accepted"
    return {"rejected": "rejected", "duplicate": "duplicate"}.get(e.outcome, "crashed")


@dataclass(frozen=True, slots=True)
class Scene:
    """One run's timeline as coordinates: worker lanes at y = 0, 1, ...; the fence's lane below.

    Attributes: spans (``"lease"``/``"pause"``/``"wait"`` -> rectangles ``(x0, x1, y,
    half_height)``), ticks (the authority's expiries, ``(x, y)``), points (a key of
    :func:`styles` -> ``[(x, y)]``), labels (``(text, x, y, dy, kind)``, ``dy`` in marker sizes,
    kind a key of LABEL_STYLES), fence (the token's step line ``(xs, ys)``, or None), and title,
    colour, caption (the verdict, its colour, and the knobs line).
    """

    spans: dict
    ticks: list
    points: dict
    labels: list
    fence: tuple | None
    title: str
    colour: str
    caption: str


def scene(result, lanes: list[str], xmax: float) -> Scene:
    """Turn a Result into a :class:`Scene` for lanes ``lanes`` on a time axis up to ``xmax``."""
    history = list(result.history)
    near = xmax * 0.045
    effects = [e for e in history if e.action in EFFECTS]
    spans = {"lease": [], "pause": [], "wait": []}
    ticks, points, labels = [], {}, []

    def mark(style, x, y):
        points.setdefault(style, []).append((x, y))

    for y, worker in enumerate(lanes):
        mine = [e for e in history if e.worker == worker]
        leases, pauses, waits, expiries = _intervals(mine)
        spans["lease"] += [(a, b, y, 0.3) for a, b in leases]
        spans["pause"] += [(a, b, y, 0.2) for a, b, _ in pauses]
        spans["wait"] += [(a, b, y, 0.14) for a, b in waits]
        ticks += [(x, y) for x in expiries]
        for a, b, point in pauses:
            if point and b - a > near * 2.5:
                labels.append((f"paused at {point}", a + near * 0.2, y, 0, "pause"))
        others = 0
        for e in mine:
            if e.action == "read" and e.outcome == "ok":
                mark("read", e.time, y - 0.42)
            elif e.action == "acquire" and e.outcome != "ok":
                mark("held", e.time, y)
            elif e.action == "crash":
                mark("crash", e.time, y)
            elif e.action == "response" and e.outcome == "lost":
                mark("lost", e.time, y)
            elif e.action not in _QUIET and e.action not in EFFECTS:
                mark("other", e.time, y)
                others += 1
                if others <= 6:
                    labels.append((e.action, e.time, y, -1.0, "other"))
        writes = [(i, e) for i, e in enumerate(effects) if e.worker == worker]
        last, flip = None, False
        for i, e in writes:
            mark(_write_kind(e, effects[i + 1 :]), e.time, y)
            if len(writes) <= 12 and e.target:
                flip = (not flip) if last is not None and e.time - last < near else False
                last = e.time
                labels.append((str(e.target), e.time, y, -1.1 if flip else 1.1, "target"))
        for v in result.violations:
            if v.event.worker == worker:
                mark("violation", v.event.time, y)
    fy = len(lanes)
    raises = [
        e for e in history if e.action == "raise" and e.outcome == "ok" and e.generation is not None
    ]
    fence = None
    if raises:
        tokens = sorted({e.generation for e in raises}, key=token)
        rank = {t: i for i, t in enumerate(tokens)}
        ys = [fy + 0.35 - 0.7 * rank[e.generation] / max(len(rank) - 1, 1) for e in raises]
        fence = ([e.time for e in raises] + [max(end_of(history), xmax)], ys + ys[-1:])
        for i, (e, yy) in enumerate(zip(raises, ys)):
            if i == 0 or e.generation != raises[i - 1].generation:  # label each new token once
                labels.append((str(e.generation), e.time, yy, 0.4, "fence"))
    else:
        labels.append(("no fenced write: the fence was never raised", 0.0, fy, 0, "note"))
    knobs = ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in result.params.items()
        if k not in ("protected", "seed")
    )
    mode = {True: "protected", False: "unprotected"}.get(result.params.get("protected"), "")
    hidden = len(dict.fromkeys(e.worker for e in history)) - len(lanes)
    extra = f" · {hidden} more workers not shown" if hidden > 0 else ""
    caption = f"{mode} · {knobs} · seed={result.params.get('seed', '?')}{extra}"
    colour = COLOURS["rejected"] if result.violations else "#222222"
    return Scene(spans, ticks, points, labels, fence, result.verdict, colour, caption)
