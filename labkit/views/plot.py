"""Pictures of scenario runs: a timeline per run, an outcome map over two knobs, presenter mode.

Everything drawn comes from a :class:`~labkit.sim.engine.Result`: its history (what
each worker tried and what it was answered) and the checker's violations.
Colours are the Okabe-Ito palette, which stays distinct for the common forms
of colour blindness, and every kind of write also has its own marker shape.
Nothing here changes matplotlib's settings at import time; :func:`present`
does, when called.
"""

from __future__ import annotations

import itertools
import textwrap
from dataclasses import dataclass

import matplotlib as mpl
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from labkit.errors import BadArgument
from labkit.sim.history import EFFECTS, VIOLATION_KINDS

__all__ = ["timeline", "outcome_map", "verdict_table", "present", "scene", "Scene", "COLOURS"]

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
    "violation": "#000000",
}
_MARKERS = {"accepted": "o", "overwritten": "s", "rejected": "X", "duplicate": "P", "crashed": "x"}
_MAX_LANES = 14
_QUIET = {
    "read",
    "acquire",
    "renew",
    "release",
    "wait",
    "pause",
    "resume",
    "crash",
    "raise",
    "response",
}


_IN = {"left": 0.75, "right": 0.3, "top": 0.75, "bottom": 1.45, "lane": 0.62, "width": 11.0}


def _inch(name: str) -> float:
    """A layout length in inches, scaled with the font size (presenter mode makes everything bigger)."""
    return _IN[name] * max(1.0, mpl.rcParams["font.size"] / 10.0)


def _size(lanes: int, top: float | None = None) -> tuple[float, float]:
    top = _inch("top") if top is None else top
    return _inch("width"), top + _inch("bottom") + _inch("lane") * (lanes + 1) + 0.3


def _margins(fig, top: float | None = None) -> None:
    """Fixed margins in inches, so the axes never move between runs."""
    w, h = fig.get_size_inches()
    top = _inch("top") if top is None else top
    fig.subplots_adjust(
        left=_inch("left") / w,
        right=1 - _inch("right") / w,
        top=1 - top / h,
        bottom=_inch("bottom") / h,
    )


def _lanes(history) -> list[str]:
    workers = list(dict.fromkeys(e.worker for e in history))
    if len(workers) <= _MAX_LANES:
        return workers
    busy = [
        w
        for w in workers
        if any(e.worker == w and e.outcome == "ok" and e.action != "read" for e in history)
    ]
    return busy[:_MAX_LANES]


def _end(history) -> float:
    return max(
        [e.time for e in history]
        + [e.until for e in history if e.until is not None and e.action == "pause"]
        + [1.0]
    )


def _intervals(events, tick: float = 0.5):
    """Lease-held intervals, pauses and waits of one worker's events, plus its expiries."""
    leases, pauses, waits, expiries, released = [], [], [], [], set()
    start = until = None
    wait_from = None
    for e in events:
        if e.action == "wait":
            wait_from = e.time if wait_from is None else wait_from
            continue
        if wait_from is not None:
            waits.append((wait_from, max(e.time, wait_from + tick)))
            wait_from = None
        if e.action == "acquire" and e.outcome == "ok":
            if start is not None:
                leases.append((start, min(until, e.time)))
            start, until = e.time, e.until if e.until is not None else e.time
        elif (
            e.action == "renew" and e.outcome == "ok" and start is not None and e.until is not None
        ):
            until = e.until
        elif e.action == "release" and e.outcome == "ok" and start is not None:
            if e.time < until:
                until = e.time
                released.add(until)
            leases.append((start, until))
            start = None
        elif e.action == "pause":
            end = e.until if e.until is not None else e.time
            crash = next(
                (c.time for c in events if c.action == "crash" and e.time <= c.time < end), None
            )
            pauses.append((e.time, crash if crash is not None else end, e.target))
    if wait_from is not None:
        waits.append((wait_from, wait_from + tick))
    if start is not None:
        leases.append((start, until))
    expiries = sorted({end for _, end in leases if end not in released})
    return leases, pauses, waits, expiries


def _write_kind(e, later) -> str:
    if e.outcome == "ok":
        replaced = any(
            o.target == e.target and o.worker != e.worker and o.outcome == "ok" for o in later
        )
        return "overwritten" if replaced else "accepted"
    return {"rejected": "rejected", "duplicate": "duplicate"}.get(e.outcome, "crashed")


def _token_rank(tokens):
    def order(t):
        return tuple(t) if isinstance(t, (tuple, list)) else (0, t)

    ranked = sorted(set(tokens), key=order)
    return {t: i for i, t in enumerate(ranked)}


def _legend(ax):
    size = mpl.rcParams["lines.markersize"]
    handles = [
        Patch(facecolor=COLOURS["lease"], alpha=0.45, label="lease held"),
        Line2D([], [], color=COLOURS["expiry"], lw=2.5, label="lease expires (authority)"),
        Patch(facecolor="white", edgecolor="#444444", hatch="///", label="paused"),
        Patch(
            facecolor=COLOURS["wait"], edgecolor="#444444", hatch="..", label="waiting for the lock"
        ),
        Line2D([], [], ls="", marker="v", color=COLOURS["read"], ms=size * 0.8, label="read"),
        Line2D(
            [], [], ls="", marker=".", color="#aaaaaa", ms=size * 0.8, label="lease refused (held)"
        ),
        *[
            Line2D([], [], ls="", marker=_MARKERS[k], color=COLOURS[k], ms=size * 1.3, label=label)
            for k, label in (
                ("accepted", "write accepted"),
                ("overwritten", "write replaced later"),
                ("rejected", "write rejected (stale)"),
                ("duplicate", "repeat stopped by key"),
            )
        ],
        Line2D([], [], ls="", marker="*", color=COLOURS["crash"], ms=size * 1.5, label="crash"),
        Line2D(
            [],
            [],
            ls="",
            marker="d",
            mfc="white",
            mec=COLOURS["crash"],
            mew=1.2,
            ms=size * 1.1,
            label="answer lost",
        ),
        Line2D(
            [],
            [],
            ls="",
            marker="o",
            mfc="none",
            mec=COLOURS["violation"],
            mew=2,
            ms=size * 2.2,
            label="violation",
        ),
        Line2D([], [], color=COLOURS["fence"], drawstyle="steps-post", label="fence token"),
    ]
    fig_h = ax.figure.get_size_inches()[1]
    below = -0.62 * _inch("lane") / _IN["lane"] / fig_h / ax.get_position().height
    return ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(0.0, below),
        frameon=False,
        borderaxespad=0.0,
        ncols=5,
        fontsize="small",
        columnspacing=1.2,
        handletextpad=0.4,
    )


def _frame(ax, lanes: list[str], xmax: float, legend: bool = True) -> None:
    """The parts that depend only on the lanes and the time range (drawn once by the renderer)."""
    fy = len(lanes)
    ax.set_yticks(range(fy + 1), lanes + ["fence"])
    ax.set_ylim(fy + 0.6, -0.7)
    ax.set_xlim(-0.02 * xmax, xmax)
    ax.set_xlabel("virtual time (s)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if legend:
        _legend(ax)


@dataclass
class Scene:
    """What one run's timeline shows, as plain coordinates (lanes at y = 0, 1, ...; fence below).

    Attributes:
        spans: ``"lease"``/``"pause"``/``"wait"`` -> rectangles ``(x0, x1, y, half_height)``.
        ticks: the authority's expiries, ``(x, y)``.
        points: marker style (see :data:`STYLES`) -> ``(xs, ys)``.
        labels: ``(text, x, y, dy_points, kind)``; kind is ``"target"``, ``"pause"``,
            ``"other"``, ``"fence"`` or ``"note"``.
        fence: the fence token's step line ``(xs, ys)``, or None.
        title, colour, caption: the verdict, its colour, and the knobs line.
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
    flagged = [v.event for v in result.violations]
    effects = [e for e in history if e.action in EFFECTS]
    spans = {"lease": [], "pause": [], "wait": []}
    ticks, points, labels = [], {}, []

    def mark(style, x, y):
        xs, ys = points.setdefault(style, ([], []))
        xs.append(x)
        ys.append(y)

    for y, worker in enumerate(lanes):
        mine = [e for e in history if e.worker == worker]
        leases, pauses, waits, expiries = _intervals(mine)
        spans["lease"] += [(a, b, y, 0.3) for a, b in leases]
        spans["pause"] += [(a, b, y, 0.2) for a, b, _ in pauses]
        spans["wait"] += [(a, b, y, 0.14) for a, b in waits]
        ticks += [(x, y) for x in expiries]
        labels += [
            (f"paused at {point}", a + near * 0.2, y, 0, "pause")
            for a, b, point in pauses
            if point and b - a > near * 2.5
        ]
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
        for e in flagged:
            if e.worker == worker:
                mark("violation", e.time, y)
    fy = len(lanes)
    raises = [
        e for e in history if e.action == "raise" and e.outcome == "ok" and e.generation is not None
    ]
    fence = None
    if raises:
        rank = _token_rank(e.generation for e in raises)
        top = max(len(rank) - 1, 1)
        ys = [fy + 0.35 - 0.7 * rank[e.generation] / top for e in raises]
        fence = ([e.time for e in raises] + [max(_end(history), xmax)], ys + ys[-1:])
        shown = None
        for e, yy in zip(raises, ys):
            if e.generation != shown:
                labels.append((str(e.generation), e.time, yy, 0.4, "fence"))
                shown = e.generation
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


def styles() -> dict:
    """Marker styles by name, sized from the current ``lines.markersize`` (so presenter mode applies)."""
    size = mpl.rcParams["lines.markersize"]
    return {
        "read": dict(marker="v", color=COLOURS["read"], ms=size * 0.8),
        "held": dict(marker=".", color="#aaaaaa", ms=size * 0.8),
        "crash": dict(marker="*", color=COLOURS["crash"], ms=size * 1.5),
        "lost": dict(marker="d", mfc="white", mec=COLOURS["crash"], mew=1.2, ms=size * 1.1),
        "other": dict(marker="|", color="#333333", ms=size * 1.6, mew=1.5),
        **{
            k: dict(
                marker=_MARKERS[k],
                color=COLOURS.get(k, COLOURS["crash"]),
                ms=size * 1.3,
                mec="white" if k != "crashed" else COLOURS["crash"],
                mew=0.8,
                zorder=5,
            )
            for k in _MARKERS
        },
        "violation": dict(
            marker="o", mfc="none", mec=COLOURS["violation"], mew=2, ms=size * 2.2, zorder=6
        ),
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


def boxes(spans) -> list:
    """Rectangles ``(x0, x1, y, half_height)`` as PolyCollection vertices."""
    return [[(a, y - h), (a, y + h), (b, y + h), (b, y - h)] for a, b, y, h in spans]


def _paint(ax, sc: Scene) -> None:
    """Draw a Scene with ordinary matplotlib artists (for :func:`timeline`)."""
    size = mpl.rcParams["lines.markersize"]
    for kind, spans in sc.spans.items():
        ax.add_collection(PolyCollection(boxes(spans), **SPAN_STYLES[kind]), autolim=False)
    if sc.ticks:
        ax.vlines(
            [x for x, _ in sc.ticks],
            [y - 0.42 for _, y in sc.ticks],
            [y + 0.42 for _, y in sc.ticks],
            color=COLOURS["expiry"],
            lw=2.5,
        )
    marker_styles = styles()
    for style, (xs, ys) in sc.points.items():
        ax.plot(xs, ys, ls="", **marker_styles[style])
    if sc.fence:
        ax.step(
            *sc.fence,
            where="post",
            color=COLOURS["fence"],
            lw=mpl.rcParams["lines.linewidth"] * 1.5,
        )
    for text, x, y, dy, kind in sc.labels:
        style = dict(LABEL_STYLES[kind])
        if kind == "pause":
            style["bbox"] = dict(facecolor="white", edgecolor="none", pad=1.0)
        if kind == "target":
            style["va"] = "bottom" if dy > 0 else "top"
        ax.annotate(
            text,
            (x, y),
            xytext=(2 if kind in ("other", "fence") else 0, dy * size),
            textcoords="offset points",
            **style,
        )
    h = ax.figure.get_size_inches()[1] * ax.get_position().height
    ax.text(
        0.0,
        -(_inch("bottom") - 0.12) / h,
        sc.caption,
        transform=ax.transAxes,
        fontsize="small",
        color="#555555",
        va="bottom",
    )
    ax.set_title(textwrap.fill(sc.title, 88), loc="left", color=sc.colour)


def timeline(result, ax=None):
    """Draw one run: a lane per worker, the fence's token in its own lane, the verdict as title.

    Each worker's lane shows its lease-held intervals (bars) and the
    authority's expiry (a blue tick), pauses (hatched, with where they
    happened), waits for SQLite's write lock (dotted yellow), reads (small
    triangles) and every write as a marker: accepted, replaced later by
    another worker, rejected by the fence, or stopped by an operation key.
    Events the checker flagged get a black ring. The bottom lane is the
    fence's token as a step line.

    Args:
        result: a :class:`~labkit.sim.engine.Result` (or anything with ``history``,
            ``violations``, ``verdict`` and ``params``).
        ax: draw into these axes; by default a new pyplot figure of the right height.

    Returns:
        The matplotlib ``Axes``.

    Example:
        >>> from labkit.scenarios import expired_but_alive
        >>> ax = timeline(expired_but_alive(protected=False))
        >>> [t.get_text() for t in ax.get_yticklabels()]
        ['A', 'B', 'fence']
    """
    lanes = _lanes(result.history)
    if ax is None:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=_size(len(lanes)))
        _margins(fig)
        ax = fig.add_subplot()
    xmax = _end(result.history) * 1.04
    _frame(ax, lanes, xmax)
    _paint(ax, scene(result, lanes, xmax))
    return ax


_OUTCOMES = ("no violation",) + VIOLATION_KINDS
_OUTCOME_COLOUR = {
    "no violation": "#009E73",
    "lost_update": "#D55E00",
    "stale_accepted": "#E69F00",
    "duplicate_effect": "#CC79A7",
    "acted_after_expiry": "#56B4E9",
    "foreign_release": "#0072B2",
}
_OUTCOME_COLOURS = tuple(_OUTCOME_COLOUR[k] for k in _OUTCOMES)
_WORST = (
    "lost_update",
    "stale_accepted",
    "duplicate_effect",
    "acted_after_expiry",
    "foreign_release",
)


def outcome_map(scenario, x, y, *, protected: bool = False, seed: int = 0, ax=None, **fixed):
    """Run ``scenario`` over a grid of two knobs and colour each cell by its worst violation.

    Args:
        scenario: a scenario function, e.g. ``expired_but_alive``.
        x, y: ``(knob, values)`` pairs, e.g. ``("pause", [0, 5, 10, 20, 30])``.
        protected: which variant to map (default: the naive one).
        seed: the seed of every run.
        ax: draw into these axes; by default a new figure.
        **fixed: other knobs, held fixed.

    Returns:
        The matplotlib ``Axes``.

    Example:
        >>> from labkit.scenarios import expired_but_alive
        >>> ax = outcome_map(expired_but_alive, ("pause", [5, 20]), ("ttl", [10, 30]))
    """
    (xname, xs), (yname, ys) = x, y
    xs, ys = list(xs), list(ys)
    cells = [[0] * len(xs) for _ in ys]
    for (j, yv), (i, xv) in itertools.product(enumerate(ys), enumerate(xs)):
        kinds = scenario(protected=protected, seed=seed, **{**fixed, xname: xv, yname: yv}).kinds
        worst = next((k for k in _WORST if k in kinds), None)
        cells[j][i] = 0 if worst is None else _OUTCOMES.index(worst)
    if ax is None:
        import matplotlib.pyplot as plt

        ax = plt.figure(figsize=(9, 4.5), layout="constrained").add_subplot()
    cmap = mpl.colors.ListedColormap(_OUTCOME_COLOURS)
    ax.imshow(cells, cmap=cmap, vmin=-0.5, vmax=len(_OUTCOMES) - 0.5, origin="lower", aspect="auto")
    ax.set_xticks(range(len(xs)), [f"{v:g}" for v in xs])
    ax.set_yticks(range(len(ys)), [f"{v:g}" for v in ys])
    ax.set_xlabel(xname + " (s)" if xname not in ("repeats", "contenders") else xname)
    ax.set_ylabel(yname + " (s)" if yname not in ("repeats", "contenders") else yname)
    present = sorted({c for row in cells for c in row})
    ax.legend(
        handles=[
            Patch(color=_OUTCOME_COLOURS[c], label=_OUTCOMES[c].replace("_", " ")) for c in present
        ],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
    )
    defaults = getattr(scenario, "knobs", {})
    if defaults.get(xname) in xs and defaults.get(yname) in ys:
        ax.annotate(
            "source's numbers",
            (xs.index(defaults[xname]), ys.index(defaults[yname])),
            ha="center",
            va="center",
            fontsize="small",
            color="white",
            fontweight="bold",
        )
    name = getattr(scenario, "__name__", "scenario")
    ax.set_title(
        f"{name}, {'protected' if protected else 'unprotected'}: worst outcome per run", loc="left"
    )
    return ax


def verdict_table(rows, *, verdicts=(1,), ok: str = "no violation", ax=None):
    """Draw rows of text as a table whose verdict columns are coloured by outcome.

    The first row is the header, in bold. Each column starts where the longest
    text of the column before it (plus a gap) ends, so the table needs no
    hand-placed positions. In the ``verdicts`` columns, a cell equal to ``ok``
    is green and any other text vermilion (Okabe-Ito, as the timelines); all
    other cells are dark grey.

    Args:
        rows: a header row, then data rows; every row has the same number of cells.
        verdicts: the indexes of the columns to colour, e.g. ``(1, 2)``.
        ok: the text that means "nothing went wrong".
        ax: draw into these axes; by default a new figure sized to the table.

    Returns:
        The matplotlib ``Axes``.

    Raises:
        BadArgument: no rows, rows of different lengths, or a ``verdicts``
            index outside the columns.

    Example:
        >>> ax = verdict_table([("scenario", "naive"), ("herd", "no violation")])
        >>> [t.get_text() for t in ax.texts]
        ['scenario', 'naive', 'herd', 'no violation']
    """
    rows = [tuple(map(str, row)) for row in rows]
    if not rows or len({len(row) for row in rows}) != 1:
        raise BadArgument("rows", "needs a header row and rows of the same length")
    columns = len(rows[0])
    if any(not 0 <= i < columns for i in verdicts):
        raise BadArgument(
            "verdicts", f"column indexes must be in 0 .. {columns - 1}, got {tuple(verdicts)}"
        )
    widths = [
        max(len(line) for row in rows for line in row[i].splitlines() or [""]) + 3
        for i in range(columns)
    ]
    starts = [sum(widths[:i]) / sum(widths) for i in range(columns)]
    if ax is None:
        import matplotlib.pyplot as plt

        size = (max(6.0, 0.132 * sum(widths)), 0.45 * len(rows) + 0.4)
        ax = plt.figure(figsize=size, layout="constrained").add_subplot()
    for y, row in enumerate(rows):
        for x, (start, text) in enumerate(zip(starts, row)):
            colour = (
                "#222222"
                if y == 0 or x not in verdicts
                else (COLOURS["accepted"] if text == ok else COLOURS["rejected"])
            )
            ax.text(
                start,
                y,
                text,
                va="center",
                fontsize=13,
                color=colour,
                weight="bold" if y == 0 else "normal",
            )
    ax.set(xlim=(0, 1), ylim=(len(rows) - 0.5, -0.5))
    ax.axis("off")
    return ax


_PRESENTER = {
    "font.size": 16,
    "axes.titlesize": 18,
    "axes.labelsize": 16,
    "xtick.labelsize": 14,
    "ytick.labelsize": 15,
    "legend.fontsize": 13,
    "lines.linewidth": 3.0,
    "lines.markersize": 10,
    "hatch.linewidth": 1.6,
    "axes.linewidth": 1.6,
}


class present:
    """Presenter mode for projecting: larger fonts, thicker lines, bigger markers.

    Calling ``present()`` switches it on (``present(False)`` off again, back to
    the settings from before). Used as a context manager, it restores the
    previous settings on exit. Nothing changes until you call it.

    Example:
        >>> with present():
        ...     mpl.rcParams["font.size"]
        16.0
    """

    _before: dict | None = None

    def __init__(self, on: bool = True) -> None:
        self._saved = {k: mpl.rcParams[k] for k in _PRESENTER}
        if on:
            if present._before is None:
                present._before = dict(self._saved)
            mpl.rcParams.update(_PRESENTER)
        elif present._before is not None:
            mpl.rcParams.update(present._before)
            present._before = None

    def __enter__(self) -> "present":
        return self

    def __exit__(self, *exc) -> None:
        mpl.rcParams.update(self._saved)
        if self._saved == present._before:
            present._before = None
