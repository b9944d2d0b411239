"""What one run's timeline shows, as plain coordinates, and the styles it is drawn with.

:func:`scene` turns a Result into a :class:`Scene`, which the timeline and the panel's renderer
both draw. Colours are Okabe-Ito (distinct for the common colour blindnesses)."""

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import matplotlib as mpl

from labkit.fence import token
from labkit.sim.history import EFFECTS, TICK

__all__ = ["Scene", "scene", "styles", "x_range", "COLOURS", "SPAN_STYLES", "LABEL_STYLES"]

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
    "target": dict(fontsize="x-small"),
    "pause": dict(fontsize="x-small", color="#333333"),
    "other": dict(fontsize="x-small", color="#333333"),
    "fence": dict(fontsize="small", color=COLOURS["fence"], fontweight="bold"),
    "note": dict(fontsize="small", color="#555555"),
}
_MAX_LANES = 14  # a herd of 100 shows its 13 busiest workers and a lane for the rest
OTHERS = "others"  # that lane's name: the refused attempts of the workers without a lane
_STEPS = (10, 12, 14, 16, 18, 20, 22, 25, 30, 35, 40, 45, 50, 60, 70, 80, 90, 100)
_QUIET = set("read acquire renew release wait pause resume crash raise response".split())


def styles() -> Mapping:
    """Marker styles by name, sized from the current ``lines.markersize`` (so presenter mode applies)."""
    return _styles(mpl.rcParams["lines.markersize"])


@functools.lru_cache(maxsize=8)
def _styles(size: float) -> Mapping:
    """The styles for one marker size, read-only, made once (a redraw asks for them six times)."""
    write = dict(ms=size * 1.3, mew=0.8, zorder=5)
    made = {
        "read": dict(marker="v", color=COLOURS["read"], ms=size * 0.8),
        "held": dict(marker=".", color="#aaaaaa", ms=size * 0.8),
        "renewed": dict(marker="^", mfc="white", mec=COLOURS["expiry"], mew=1.5, ms=size * 1.1),
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
        "warning": dict(  # timing discipline, not harm: a thin grey diamond, never the ring
            marker="D", mfc="none", mec="#777777", mew=1.2, ms=size * 1.9, zorder=5
        ),
    }
    return MappingProxyType({name: MappingProxyType(style) for name, style in made.items()})


def lanes_of(history, most: int = _MAX_LANES) -> list[str]:
    """The workers in order of appearance; beyond ``most``, the first ``most - 1`` that did
    something that counted, then :data:`OTHERS` (the caption counts the workers left out)."""
    workers = list(dict.fromkeys(e.worker for e in history))
    if len(workers) <= most:
        return workers
    busy = {e.worker for e in history if e.outcome == "ok" and e.action != "read"}
    return [w for w in workers if w in busy][: most - 1] + [OTHERS]


def merge_lanes(lanes: list[str], more: list[str]) -> list[str]:
    """``lanes``, then those of ``more`` not in it: at most 14, :data:`OTHERS` last if needed."""
    merged = [w for w in dict.fromkeys([*lanes, *more]) if w != OTHERS]
    cut = OTHERS in lanes or OTHERS in more or len(merged) > _MAX_LANES
    return merged[: _MAX_LANES - 1] + [OTHERS] if cut else merged


def end_of(history) -> float:
    """The last moment a run shows: its last event or the end of its last pause (at least 1)."""
    pauses = [e.until for e in history if e.until is not None and e.action == "pause"]
    return max([e.time for e in history] + pauses + [1.0])


def x_range(end: float) -> float:
    """The time axis's right end for a run that ends at ``end``: ``end`` plus 3%, rounded up to the
    next of 10, 12, 14, ... 90, 100, 120, ... (times a power of ten): below 1.25 x ``end``, and
    the same while ``end`` moves between two steps."""
    need = max(end, 1.0) * 1.03
    scale = 10.0 ** math.floor(math.log10(need / 10))
    return next(s * scale for s in _STEPS if s * scale >= need * (1 - 1e-9))


def _intervals(events, end: float):
    """Lease-held intervals, pauses and waits of one worker's events, plus the expiries drawn; a
    lease with no ``until`` (a version lock) is held until its release or ``end``, with no tick."""
    leases, pauses, waits, expiries = [], [], [], []
    start = until = wait_from = None

    def close(at: float) -> None:  # the held span ends at release, re-acquire or expiry
        leases.append((start, min(until, at)))
        if until <= at:
            expiries.append(until)

    for e in events:
        if e.action == "wait":
            wait_from = e.time if wait_from is None else wait_from
            continue
        if wait_from is not None:
            waits.append((wait_from, max(e.time, wait_from + TICK)))
            wait_from = None
        ok = e.outcome == "ok"
        if e.action == "acquire" and ok:
            if start is not None:
                close(e.time)
            start, until = e.time, math.inf if e.until is None else e.until
        elif e.action == "renew" and ok and start is not None and e.until is not None:
            until = e.until
        elif e.action == "release" and ok and start is not None:
            close(e.time)
            start = None
        elif e.action == "pause":
            stop = e.until if e.until is not None else e.time
            crashes = (c.time for c in events if c.action == "crash" and e.time <= c.time < stop)
            pauses.append((e.time, next(crashes, stop), e.target))
    if wait_from is not None:
        waits.append((wait_from, wait_from + TICK))
    if start is not None:
        close(until if until < math.inf else end)
    return leases, pauses, waits, expiries


def _spread(marks: list, pt: float) -> list:
    """The x at which to draw each ``(x, size)`` mark of one row (``size`` in points, ``pt`` a
    point in data units), so that no mark covers its neighbour: each run of marks closer than
    their half sizes is set side by side, in the given order, about the middle of its first and
    last x; a run that then reaches the one before joins it (one greedy pass, deterministic)."""
    xs = [x for x, _ in marks]
    order = range(len(marks)) if xs == sorted(xs) else sorted(range(len(xs)), key=xs.__getitem__)
    pairs = zip(order, order[1:])
    if all(xs[j] - xs[i] >= (marks[i][1] + marks[j][1]) / 2 * pt for i, j in pairs):
        return xs  # nothing close: the common case, kept cheap
    runs = []  # [first x, last x, sizes, span]: drawn from (first + last - span) / 2, step by step
    for i in order:
        x, size = marks[i]
        runs.append([x, x, [size], 0.0])
        while len(runs) > 1:
            (a0, a1, a, span), (b0, b1, b, _) = runs[-2:]
            gap = (a[-1] + b[0]) / 2 * pt
            if (b0 + b1 - runs[-1][3]) / 2 - (a0 + a1 + span) / 2 >= gap:
                break
            last = runs.pop()
            runs[-1][1], runs[-1][3] = last[1], span + gap + last[3]
            runs[-1][2].extend(last[2])
    drawn = [0.0] * len(marks)
    for at, i in zip((x for run in runs for x in _layout(run, pt)), order):
        drawn[i] = at
    return drawn


def _layout(run: list, pt: float):
    """A run's marks side by side, each its and its neighbour's half sizes apart."""
    first, last, sizes, span = run
    x = (first + last - span) / 2
    yield x
    for a, b in zip(sizes, sizes[1:]):
        x += (a + b) / 2 * pt
        yield x


def _mark_of(e) -> str | None:
    """The marker of an event that is not an effect (None: it shows as a span or not at all)."""
    if e.action == "read":
        return "read" if e.outcome == "ok" else None
    if e.action in ("acquire", "renew", "release"):  # refused; a granted renewal has a mark too
        return "held" if e.outcome != "ok" else ("renewed" if e.action == "renew" else None)
    if e.action == "response":
        return "lost" if e.outcome == "lost" else None
    if e.action == "crash":
        return "crash"
    return None if e.action in _QUIET else "other"


def _write_kind(e, later) -> str:
    """An effect's marker. Only a ``write`` (a row, a file) can be replaced by a later one; a
    second email or charge is a duplicate effect, which the checker marks, not a replacement."""
    if e.outcome == "ok":
        same = [o for o in later if o.action == e.action == "write" and o.target == e.target]
        replaced = any(o.worker != e.worker and o.outcome == "ok" for o in same)
        return "overwritten" if replaced else "accepted"
    return {"rejected": "rejected", "duplicate": "duplicate"}.get(e.outcome, "crashed")


#: the markers a label must not cover
OBSTACLES = "accepted overwritten rejected duplicate crashed crash lost held renewed".split()


def label_offsets(kind: str, w: float, h: float, m: float) -> list:
    """Where a label's box may sit, as its lower-left corner in points from its anchor, best first."""
    up, down = m * 1.3, -h - m * 1.3
    first = {
        "target": [(-w / 2, up), (-w / 2, down), (m, -h / 2), (m * 0.6, up), (m * 0.6, down)]
        + [(-w - m * 0.6, up), (-w - m * 0.6, down), (-w / 2, up + h + 1), (-w - m, -h / 2)],
        "other": [(2, -h - m), (2, m * 0.6), (2, -2 * h - m - 1), (-w - 2, -h - m)],
        "fence": [(2, m * 0.4), (2, -h - m * 0.4)],
        "note": [(0, -h / 2), (0, m * 0.9), (0, -h - m * 0.9)],
    }.get(kind, [(0, -h / 2)])
    return first + [(x + m * k, y) for k in range(1, 13) for x, y in first[:2]]  # then further out


@dataclass(frozen=True, slots=True)
class Scene:
    """One run's timeline as coordinates: worker lanes at y = 0, 1, ...; the fence's lane below.

    Attributes: spans (``"lease"``/``"pause"``/``"wait"`` -> rectangles ``(x0, x1, y,
    half_height)``), ticks (the authority's expiries, ``(x, y)``), points (a key of
    :func:`styles` -> ``[(x, y)]``), labels (``(text, x, y, kind)``, kind a key of LABEL_STYLES,
    placed near ``(x, y)`` when drawn), fence (the token's step line ``(xs, ys)``, or None), and
    title, colour, caption (the verdict, its colour, and the knobs line)."""

    spans: dict
    ticks: list
    points: dict
    labels: list
    fence: tuple | None
    title: str
    colour: str
    caption: str


#: where a worker pauses (a fault's point), in the words a student reads on the timeline
PAUSE_WORDS = {
    "after-read": "after its read", "after-write": "after its write", "gc": "for garbage collection",
    "before-step": "before its next step", "between": "between its two writes",
    "inside-write": "inside its write", "before-c2": "before its second commit",
    "restart": "while it restarts", "network down": "while its network is down",
}  # fmt: skip


def pause_words(point: str) -> str:
    """``point`` as words: "paused after its read", never "paused at after-read"."""
    return PAUSE_WORDS.get(point, "at " + point.replace("-", " ").replace("_", " "))


def scene(result, lanes: list[str], xmax: float, pt: float | None = None) -> Scene:
    """Turn a Result into a :class:`Scene` for lanes ``lanes`` on a time axis up to ``xmax``;
    ``pt``, a point in data units (default: a 10-inch axis), sets close markers apart."""
    history, end = list(result.history), end_of(result.history)
    near, shown = xmax * 0.045, set(lanes)
    pt, ms = pt or xmax / 720, {name: style["ms"] for name, style in styles().items()}
    effects = [e for e in history if e.action in EFFECTS]
    index = {id(e): i for i, e in enumerate(effects)}  # by identity, as ``drawn`` below
    spans = {"lease": [], "pause": [], "wait": []}
    ticks, points, labels, drawn = [], {}, [], {}
    flagged = [("violation", v) for v in result.violations]
    flagged += [("warning", w) for w in getattr(result, "warnings", ())]

    for y, worker in enumerate(lanes):
        if worker == OTHERS:
            rest = [e for e in history if e.worker not in shown]
            refused = [e for e in rest if e.action == "acquire" and e.outcome != "ok"]
            marks = [(t, ms["held"]) for t in sorted({e.time for e in refused})]
            points.setdefault("held", []).extend((x, y) for x in _spread(marks, pt))
            text = f"{len({e.worker for e in rest})} more workers: {len(refused)} refused attempts"
            labels.append((text, 0.0, y, "note"))
            continue
        mine = [e for e in history if e.worker == worker]
        leases, pauses, waits, expiries = _intervals(mine, end)
        spans["lease"] += [(a, b, y, 0.3) for a, b in leases]
        spans["pause"] += [(a, b, y, 0.2) for a, b, _ in pauses]
        spans["wait"] += [(a, b, y, 0.14) for a, b in waits]
        ticks += [(x, y) for x in expiries]
        for a, b, point in pauses:
            if point and b - a > near * 2.5:
                labels.append((f"paused {pause_words(point)}", a + near * 0.2, y, "pause"))
        row = []  # (marker, event) in the order of the history
        for e in mine:
            kind = _write_kind(e, effects[index[id(e)] + 1 :]) if id(e) in index else _mark_of(e)
            if kind or any(f.event is e for _, f in flagged):  # a ring always circles a mark
                row.append((kind or "other", e))
        xs, rows = [e.time for _, e in row], {}
        for k, (kind, _) in enumerate(row):  # a read sits above its lane: a row of its own
            rows.setdefault(kind == "read", []).append(k)
        for which in (ks for ks in rows.values() if len(ks) > 1):
            for k, x in zip(which, _spread([(xs[k], ms[row[k][0]]) for k in which], pt)):
                xs[k] = x
        for (kind, e), x in zip(row, xs):
            points.setdefault(kind, []).append((x, y - 0.42 if kind == "read" else y))
            drawn[id(e)] = x  # by identity: an event of JSON's lists cannot be hashed
        others = [(e, x) for (kind, e), x in zip(row, xs) if kind == "other"]
        writes = [(e.target, x) for (_, e), x in zip(row, xs) if id(e) in index]
        for k, (e, x) in enumerate(others[:6]):  # an action said before: say what it did now
            again = any(o.action == e.action and o.target != e.target for o, _ in others[:k])
            labels.append((e.target if again and e.target else e.action, x, y, "other"))
        labels += [(str(t), x, y, "target") for t, x in writes if len(writes) <= 12 and t]
        for style, f in flagged:
            if f.event.worker == worker:
                points.setdefault(style, []).append((drawn.get(id(f.event), f.event.time), y))
    fy = len(lanes)
    raises = [
        e for e in history if e.action == "raise" and e.outcome == "ok" and e.generation is not None
    ]
    fence = None
    if raises:
        tokens = sorted({e.generation for e in raises}, key=token)
        rank = {t: i for i, t in enumerate(tokens)}
        ys = [fy + 0.35 - 0.7 * rank[e.generation] / max(len(rank) - 1, 1) for e in raises]
        fence = ([e.time for e in raises] + [max(end, xmax)], ys + ys[-1:])
        for i, (e, yy) in enumerate(zip(raises, ys)):
            if i == 0 or e.generation != raises[i - 1].generation:  # label each new token once
                labels.append((str(e.generation), e.time, yy, "fence"))
    else:
        labels.append(("no fenced write: the fence was never raised", 0.0, fy, "note"))
    knobs = ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in result.params.items()
        if k not in ("protected", "seed")
    )
    mode = {True: "protected", False: "unprotected"}.get(result.params.get("protected"), "")
    hidden = len(dict.fromkeys(e.worker for e in history)) - len(shown - {OTHERS})
    extra = f" · {hidden} more workers not shown" if hidden > 0 else ""
    caption = f"{mode} · {knobs} · seed={result.params.get('seed', '?')}{extra}"
    colour = COLOURS["rejected"] if result.violations else "#222222"
    return Scene(spans, ticks, points, labels, fence, result.verdict, colour, caption)
