"""Pictures of scenario runs: a timeline per run, an outcome map over two knobs, presenter mode.

Everything drawn comes from a :class:`~labkit.sim.Result`: its history (what
each worker tried and what it was answered) and the checker's violations.
Colours are the Okabe-Ito palette, which stays distinct for the common forms
of colour blindness, and every kind of write also has its own marker shape.
Nothing here changes matplotlib's settings at import time; :func:`present`
does, when called.
"""

from __future__ import annotations

import itertools
import textwrap

import matplotlib as mpl
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .history import EFFECTS, VIOLATION_KINDS

__all__ = ["timeline", "outcome_map", "present", "TimelineRenderer", "COLOURS"]

#: Okabe-Ito colours, by meaning
COLOURS = {
    "lease": "#56B4E9", "expiry": "#0072B2", "fence": "#0072B2", "wait": "#F0E442",
    "accepted": "#009E73", "overwritten": "#CC79A7", "rejected": "#D55E00",
    "duplicate": "#E69F00", "read": "#7f7f7f", "crash": "#000000", "violation": "#000000",
}
_MARKERS = {"accepted": "o", "overwritten": "s", "rejected": "X", "duplicate": "P", "crashed": "x"}
_MAX_LANES = 14
_QUIET = {"read", "acquire", "renew", "release", "wait", "pause", "resume", "crash", "raise", "response"}


_IN = {"left": 0.75, "right": 0.3, "top": 0.75, "bottom": 1.45, "lane": 0.62, "width": 11.0}


def _size(lanes: int) -> tuple[float, float]:
    return _IN["width"], _IN["top"] + _IN["bottom"] + _IN["lane"] * (lanes + 1) + 0.3


def _margins(fig) -> None:
    """Fixed margins in inches, so the axes never move between runs."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=_IN["left"] / w, right=1 - _IN["right"] / w,
                        top=1 - _IN["top"] / h, bottom=_IN["bottom"] / h)


def _lanes(history) -> list[str]:
    workers = list(dict.fromkeys(e.worker for e in history))
    if len(workers) <= _MAX_LANES:
        return workers
    busy = [w for w in workers if any(e.worker == w and e.outcome == "ok" and e.action != "read"
                                      for e in history)]
    return busy[:_MAX_LANES]


def _end(history) -> float:
    return max([e.time for e in history] + [e.until for e in history
                                           if e.until is not None and e.action == "pause"] + [1.0])


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
        elif e.action == "renew" and e.outcome == "ok" and start is not None and e.until is not None:
            until = e.until
        elif e.action == "release" and e.outcome == "ok" and start is not None:
            if e.time < until:
                until = e.time
                released.add(until)
            leases.append((start, until))
            start = None
        elif e.action == "pause":
            end = e.until if e.until is not None else e.time
            crash = next((c.time for c in events if c.action == "crash" and e.time <= c.time < end), None)
            pauses.append((e.time, crash if crash is not None else end, e.target))
    if wait_from is not None:
        waits.append((wait_from, wait_from + tick))
    if start is not None:
        leases.append((start, until))
    expiries = sorted({end for _, end in leases if end not in released})
    return leases, pauses, waits, expiries


def _write_kind(e, later) -> str:
    if e.outcome == "ok":
        replaced = any(o.target == e.target and o.worker != e.worker and o.outcome == "ok" for o in later)
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
        Patch(facecolor=COLOURS["wait"], edgecolor="#444444", hatch="..", label="waiting for the lock"),
        Line2D([], [], ls="", marker="v", color=COLOURS["read"], ms=size * 0.8, label="read"),
        Line2D([], [], ls="", marker=".", color="#aaaaaa", ms=size * 0.8, label="lease refused (held)"),
        *[Line2D([], [], ls="", marker=_MARKERS[k], color=COLOURS[k], ms=size * 1.3, label=label)
          for k, label in (("accepted", "write accepted"), ("overwritten", "write replaced later"),
                           ("rejected", "write rejected (stale)"), ("duplicate", "repeat stopped by key"))],
        Line2D([], [], ls="", marker="*", color=COLOURS["crash"], ms=size * 1.5, label="crash"),
        Line2D([], [], ls="", marker="d", mfc="white", mec=COLOURS["crash"], mew=1.2, ms=size * 1.1,
               label="answer lost"),
        Line2D([], [], ls="", marker="o", mfc="none", mec=COLOURS["violation"], mew=2,
               ms=size * 2.2, label="violation"),
        Line2D([], [], color=COLOURS["fence"], drawstyle="steps-post", label="fence token"),
    ]
    fig_h = ax.figure.get_size_inches()[1]
    below = -0.62 / fig_h / ax.get_position().height
    return ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, below), frameon=False,
                     borderaxespad=0.0, ncols=5, fontsize="small", columnspacing=1.2, handletextpad=0.4)


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


def _boxes(ax, spans, **style):
    """One PolyCollection of rectangles ``(x0, x1, y, half_height)``: one artist for all lanes."""
    verts = [[(a, y - h), (a, y + h), (b, y + h), (b, y - h)] for a, b, y, h in spans]
    return ax.add_collection(PolyCollection(verts, **style), autolim=False)


def _marks(ax, result, lanes: list[str], words: bool = True) -> list:
    """Draw one run's lanes, markers, fence line and (with ``words``) verdict and knobs; return the artists."""
    history = list(result.history)
    made = []
    size = mpl.rcParams["lines.markersize"]
    flagged = [v.event for v in result.violations]
    end = _end(history)
    effects = [e for e in history if e.action in EFFECTS]
    xmin, xmax = ax.get_xlim()
    near = (xmax - xmin) * 0.045
    spans = {"lease": [], "pause": [], "wait": []}
    ticks, points = [], {}      # expiry ticks; marker style -> (xs, ys)

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
        for a, b, point in pauses:
            if point and (b - a) > near * 2.5:
                made.append(ax.text(a + near * 0.2, y, f"paused at {point}", va="center",
                                    fontsize="x-small", color="#333333", clip_on=True,
                                    bbox=dict(facecolor="white", edgecolor="none", pad=1.0)))
        for e in mine:
            if e.action == "read" and e.outcome == "ok":
                mark("read", e.time, y - 0.42)
            elif e.action == "acquire" and e.outcome != "ok":
                mark("held", e.time, y)
            elif e.action == "crash":
                mark("crash", e.time, y)
            elif e.action == "response" and e.outcome == "lost":
                mark("lost", e.time, y)
            elif e.action not in _QUIET and e.action not in EFFECTS and len(made) < 40:
                mark("other", e.time, y)
                made.append(ax.annotate(e.action, (e.time, y), xytext=(2, -size * 0.9), textcoords="offset points",
                                        fontsize="x-small", color="#333333", va="top"))
        writes = [(i, e) for i, e in enumerate(effects) if e.worker == worker]
        last_label, flip = None, False
        for i, e in writes:
            mark(_write_kind(e, effects[i + 1:]), e.time, y)
            if len(writes) <= 12 and e.target:
                flip = (not flip) if last_label is not None and e.time - last_label < near else False
                last_label = e.time
                made.append(ax.annotate(str(e.target), (e.time, y), xytext=(0, -size * 1.1 if flip else size * 1.1),
                                        textcoords="offset points", ha="center",
                                        va="top" if flip else "bottom", fontsize="x-small"))
        for e in flagged:
            if e.worker == worker:
                mark("violation", e.time, y)
    made.append(_boxes(ax, spans["lease"], facecolor=COLOURS["lease"], alpha=0.45, linewidth=0))
    made.append(_boxes(ax, spans["pause"], facecolor="white", edgecolor="#444444", hatch="///"))
    made.append(_boxes(ax, spans["wait"], facecolor=COLOURS["wait"], edgecolor="#444444", hatch=".."))
    if ticks:
        made.append(ax.vlines([x for x, _ in ticks], [y - 0.42 for _, y in ticks], [y + 0.42 for _, y in ticks],
                              color=COLOURS["expiry"], lw=2.5))
    styles = {
        "read": dict(marker="v", color=COLOURS["read"], ms=size * 0.8),
        "held": dict(marker=".", color="#aaaaaa", ms=size * 0.8),
        "crash": dict(marker="*", color=COLOURS["crash"], ms=size * 1.5),
        "lost": dict(marker="d", mfc="white", mec=COLOURS["crash"], mew=1.2, ms=size * 1.1),
        "other": dict(marker="|", color="#333333", ms=size * 1.6, mew=1.5),
        **{k: dict(marker=_MARKERS[k], color=COLOURS.get(k, COLOURS["crash"]), ms=size * 1.3,
                   mec="white" if k != "crashed" else COLOURS["crash"], mew=0.8, zorder=5)
           for k in _MARKERS},
        "violation": dict(marker="o", mfc="none", mec=COLOURS["violation"], mew=2, ms=size * 2.2, zorder=6),
    }
    for style, (xs, ys) in points.items():
        made += ax.plot(xs, ys, ls="", **styles[style])
    fy = len(lanes)
    raises = [e for e in history if e.action == "raise" and e.outcome == "ok" and e.generation is not None]
    if raises:
        rank = _token_rank(e.generation for e in raises)
        top = max(len(rank) - 1, 1)
        xs = [e.time for e in raises] + [max(end, xmax)]
        ys = [fy + 0.35 - 0.7 * rank[e.generation] / top for e in raises]
        made += ax.step(xs, ys + ys[-1:], where="post", color=COLOURS["fence"],
                        lw=mpl.rcParams["lines.linewidth"] * 1.5)
        shown = None
        for e, yy in zip(raises, ys):
            if e.generation != shown:
                made.append(ax.annotate(str(e.generation), (e.time, yy), xytext=(3, 2),
                                        textcoords="offset points", color=COLOURS["fence"],
                                        fontsize="small", fontweight="bold"))
                shown = e.generation
    else:
        made.append(ax.text(0, fy, "  no fenced write: the fence was never raised", va="center",
                            color="#555555", fontsize="small"))
    if not words:
        return made
    knobs = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in result.params.items() if k not in ("protected", "seed"))
    mode = {True: "protected", False: "unprotected"}.get(result.params.get("protected"), "")
    hidden = len(dict.fromkeys(e.worker for e in history)) - len(lanes)
    extra = f" · {hidden} more workers not shown" if hidden > 0 else ""
    made.append(ax.text(0.0, -(_IN["bottom"] - 0.12) / ax.figure.get_size_inches()[1] / ax.get_position().height,
                        f"{mode} · {knobs} · seed={result.params.get('seed', '?')}{extra}",
                        transform=ax.transAxes, fontsize="small", color="#555555", va="bottom"))
    made.append(ax.set_title(textwrap.fill(result.verdict, 88), loc="left",
                             color=COLOURS["rejected"] if result.violations else "#222222"))
    return made


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
        result: a :class:`~labkit.sim.Result` (or anything with ``history``,
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
    _frame(ax, lanes, _end(result.history) * 1.04)
    _marks(ax, result, lanes)
    return ax


_STEPS = (10, 15, 20, 30, 40, 50, 60, 80, 100, 120, 150, 200, 300, 400, 600, 1000)


class TimelineRenderer:
    """Draw many runs fast as PNG bytes (the slider panel): the frame is drawn once and reused.

    The lanes, ticks and legend are rendered once per (lanes, time range); each
    run then only draws its own marks over a copy of that background (blitting).
    Text is what costs most to draw, so by default (``words=False``) the verdict
    and the knobs are left out of the image: the panel shows them as HTML.
    The time range only grows, in round steps, so the picture does not jump
    while a slider moves.

    Example:
        >>> from labkit.scenarios import expired_but_alive
        >>> png = TimelineRenderer().png(expired_but_alive())
        >>> png[:4]
        b'\\x89PNG'
    """

    def __init__(self, dpi: int = 80, xmax: float = 0.0, words: bool = False) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        self.dpi, self.xmax, self.words = dpi, xmax, words
        self.figure = Figure(dpi=dpi)
        self.canvas = FigureCanvasAgg(self.figure)
        self.ax = self.figure.add_subplot()
        self._key = None
        self._background = None

    def _prepare(self, lanes: list[str], end: float) -> None:
        xmax = max(self.xmax, next((s for s in _STEPS if s >= end * 1.03), end * 1.1))
        key = (tuple(lanes), xmax, tuple(sorted(mpl.rcParams[k] for k in ("font.size", "lines.linewidth"))))
        if key == self._key:
            self.canvas.restore_region(self._background)
            return
        self.xmax = xmax
        self.figure.set_size_inches(*_size(len(lanes)))
        _margins(self.figure)
        self.ax.clear()
        _frame(self.ax, lanes, xmax)
        self.canvas.draw()
        self._background = self.canvas.copy_from_bbox(self.figure.bbox)
        self._key = key

    def png(self, result) -> bytes:
        """Render ``result``'s timeline and return it as PNG bytes."""
        import io
        from PIL import Image
        lanes = _lanes(result.history)
        self._prepare(lanes, _end(result.history))
        made = _marks(self.ax, result, lanes, self.words)
        renderer = self.canvas.get_renderer()
        for artist in made:
            artist.draw(renderer)
        for artist in made:
            try:
                artist.remove()
            except NotImplementedError:   # a title: it stays, emptied
                artist.set_text("")
        width, height = self.canvas.get_width_height()
        image = Image.frombuffer("RGBA", (width, height), self.canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        out = io.BytesIO()
        image.convert("RGB").save(out, format="PNG", compress_level=1)
        return out.getvalue()


_OUTCOMES = ("no violation",) + VIOLATION_KINDS
_OUTCOME_COLOURS = ("#009E73", "#D55E00", "#E69F00", "#CC79A7", "#56B4E9", "#0072B2")
_WORST = ("lost_update", "stale_accepted", "duplicate_effect", "acted_after_expiry", "foreign_release")


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
    ax.legend(handles=[Patch(color=_OUTCOME_COLOURS[c], label=_OUTCOMES[c].replace("_", " "))
                       for c in present], loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    name = getattr(scenario, "__name__", "scenario")
    ax.set_title(f"{name}, {'protected' if protected else 'unprotected'}: worst outcome per run", loc="left")
    return ax


_PRESENTER = {
    "font.size": 16, "axes.titlesize": 18, "axes.labelsize": 16, "xtick.labelsize": 14,
    "ytick.labelsize": 15, "legend.fontsize": 13, "lines.linewidth": 3.0,
    "lines.markersize": 10, "hatch.linewidth": 1.6, "axes.linewidth": 1.6,
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
