"""Pictures of scenario runs: a timeline per run, an outcome map over two knobs, a verdict table.

The panel's renderer (:mod:`labkit.views.widgets`) shares the timeline's artists. Helpers take
``ax=None`` and return the axes; only :class:`present` changes settings."""

import functools
import math
import textwrap

import matplotlib as mpl
import numpy as np
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, PathPatch
from matplotlib.textpath import TextPath
from matplotlib.transforms import Affine2D, ScaledTranslation

from labkit.errors import BadArgument, check_number
from labkit.views.scene import COLOURS, LABEL_STYLES, SPAN_STYLES, end_of, lanes_of, scene, styles
from labkit.views.scene import OBSTACLES, label_offsets, x_range

__all__ = ["timeline", "outcome_map", "verdict_table", "present"]

_IN = {"left": 0.9, "right": 0.3, "top": 0.75, "bottom": 1.45, "lane": 0.62, "width": 11.0}
_MARK_LABELS = {
    "read": "read",
    "held": "lease request refused",
    "renewed": "lease renewed (authority)",
    "accepted": "write accepted",
    "overwritten": "write replaced later",
    "rejected": "write rejected (stale)",
    "duplicate": "repeat stopped by key",
    "crash": "crash",
    "lost": "answer lost",
    "violation": "violation (harm in the data)",
    "warning": "warning (acted after its lease)",
}


def _inch(name: str) -> float:
    """A layout length in inches, scaled with the font size, but the width, which stays near a
    notebook output's (so the browser shows text at the size drawn)."""
    scale = max(1.0, mpl.rcParams["font.size"] / 10.0)
    if name == "bottom":
        return scale * (0.85 + 0.2 * math.ceil((len(_MARK_LABELS) + 5) / _columns()))
    return _IN[name] * (1.0 if name == "width" else scale)


def _columns() -> int:
    return 5 if mpl.rcParams["font.size"] < 12.5 else 3


def fit_figure(fig, lanes: int, top: float | None = None) -> None:
    """Size ``fig`` for ``lanes`` worker lanes, with margins fixed in inches so the axes never move."""
    top = _inch("top") if top is None else top
    w, h = _inch("width"), top + _inch("bottom") + _inch("lane") * (lanes + 1) + 0.3
    fig.set_size_inches(w, h)
    left, right, bottom = _inch("left") / w, 1 - _inch("right") / w, _inch("bottom") / h
    fig.subplots_adjust(left=left, right=right, top=1 - top / h, bottom=bottom)


def _fence_style() -> dict:
    width = mpl.rcParams["lines.linewidth"] * 1.5
    return dict(color=COLOURS["fence"], drawstyle="steps-post", lw=width)


def frame(ax, lanes: list[str], xmax: float, xlabel: str = "virtual time (s)") -> None:
    """The parts that depend only on the lanes and the time range: ticks, grid, legend."""
    ax.set_yticks(range(len(lanes) + 1), lanes + ["fence"])
    ax.set(ylim=(len(lanes) + 0.6, -0.7), xlim=(-0.02 * xmax, xmax))
    ax.set(xlabel=xlabel, axisbelow=True)
    ax.grid(axis="x", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    marks = styles()
    handles = [
        Patch(**SPAN_STYLES["lease"], label="lease held"),
        Line2D([], [], color=COLOURS["expiry"], lw=2.5, label="lease expires (authority)"),
        Patch(**SPAN_STYLES["pause"], label="paused"),
        Patch(**SPAN_STYLES["wait"], label="waiting for the lock"),
        *(Line2D([], [], ls="", **marks[k], label=text) for k, text in _MARK_LABELS.items()),
        Line2D([], [], **_fence_style(), label="fence token"),
    ]
    below = -0.62 * _inch("lane") / _IN["lane"] / ax.figure.get_size_inches()[1]
    style = dict(
        frameon=False, borderaxespad=0, columnspacing=1.2, handletextpad=0.4, ncols=_columns()
    )
    wide = ax.get_position().width * ax.figure.get_size_inches()[0]
    left = 0.0 if _columns() == 5 else (0.1 - _inch("left")) / wide  # presenter: from the edge
    anchor = (left, below / ax.get_position().height)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=anchor, fontsize="small", **style)


def point_in_data(ax) -> float:
    """One point along ``ax``'s time axis, in data units (seconds)."""
    x0, x1 = ax.get_xlim()
    return (x1 - x0) * ax.figure.dpi / 72 / ax.get_window_extent().width


def add_artists(ax, animated: bool = False) -> dict:
    """Empty artists for every part of a Scene but its labels, added to ``ax`` (see :func:`fill`)."""
    made = {kind: PolyCollection([], **style) for kind, style in SPAN_STYLES.items()}
    made["ticks"] = LineCollection([], colors=COLOURS["expiry"], linewidths=2.5)
    for collection in made.values():
        ax.add_collection(collection, autolim=False)
    made["fence"] = Line2D([], [], **_fence_style())
    made.update({name: Line2D([], [], ls="", **style) for name, style in styles().items()})
    for artist in made.values():
        if isinstance(artist, Line2D):
            ax.add_line(artist)
        artist.set_animated(animated)
    return made


def fill(made: dict, sc) -> list:
    """Give the artists of :func:`add_artists` Scene ``sc``'s coordinates; return the non-empty ones."""
    for kind, spans in sc.spans.items():
        made[kind].set_verts(
            [[(a, y - h), (a, y + h), (b, y + h), (b, y - h)] for a, b, y, h in spans]
        )
    made["ticks"].set_segments([[(x, y - 0.42), (x, y + 0.42)] for x, y in sc.ticks])
    made["fence"].set_data(*(sc.fence or ([], [])))
    for name in styles():
        made[name].set_data(*(zip(*sc.points[name]) if sc.points.get(name) else ([], [])))
    drawn = {**sc.spans, "ticks": sc.ticks, "fence": sc.fence, **sc.points}
    return [artist for name, artist in made.items() if drawn.get(name)]


@functools.lru_cache(maxsize=4096)
def _outline(text: str, kind: str, base: float) -> tuple:
    """``text`` in style ``kind`` as a path in points and its extents (``base``, the font size,
    keys the cache)."""
    style = LABEL_STYLES[kind]
    prop = FontProperties(size=style["fontsize"], weight=style.get("fontweight", "normal"))
    path = TextPath((0, 0), text, prop=prop)
    return path, path.get_extents()


def _place(ax, sc) -> list:
    """Each label's offset from its anchor in points and its box in display pixels, so that no
    two labels, nor a label and a write marker, overlap.

    One greedy, deterministic pass (not adjustText, which moves Text artists on every draw): each
    label in turn takes the first free place of :func:`label_offsets`, inside the axes if it can."""
    px, m = ax.figure.dpi / 72, mpl.rcParams["lines.markersize"]
    taken = []
    for name in OBSTACLES:
        if sc.points.get(name):
            at, half = ax.transData.transform(sc.points[name]), styles()[name]["ms"] * px * 0.4
            taken += [tuple(box) for box in np.hstack([at - half, at + half])]
    inside, placed = ax.get_window_extent(), []
    anchors = ax.transData.transform([(x, y) for _, x, y, _ in sc.labels])
    for (text, _, _, kind), anchor in zip(sc.labels, anchors):
        box = _outline(text, kind, mpl.rcParams["font.size"])[1]
        offsets = np.array(label_offsets(kind, box.width, box.height, m))
        corner = offsets * px + anchor
        tries = np.hstack([corner, corner + (box.width * px, box.height * px)])
        held, box4 = np.array(taken).reshape(1, -1, 2, 2), tries.reshape(-1, 1, 2, 2)  # corners
        pad = np.array([m * px, 1])  # a gap, so that neighbours don't read as one label
        overlap = (box4[:, :, 0] < held[:, :, 1] + pad) & (held[:, :, 0] < box4[:, :, 1] + pad)
        free = ~overlap.all(axis=2).any(axis=1)
        within = ((tries[:, :2] >= inside.p0) & (tries[:, 2:] <= inside.p1)).all(axis=1)
        best = np.flatnonzero(free & within)
        best = best[0] if len(best) else next(iter(np.flatnonzero(free)), 0)
        taken.append(tuple(tries[best]))
        placed.append((tuple(offsets[best]), taken[-1]))
    return placed


def label_patches(ax, sc) -> tuple[list, list]:
    """Scene ``sc``'s labels as glyph-outline patches placed by :func:`_place`, and their boxes
    ``[(text, (x0, y0, x1, y1))]`` in image pixels (origin top left). Outlines, because Agg lays
    real text out on every draw: ``annotate`` made the panel twice as slow (benchmarks/slider.py).
    """
    patches, boxes, height = [], [], ax.figure.bbox.height
    for (text, x, y, kind), ((ox, oy), box) in zip(sc.labels, _place(ax, sc)):
        path, extents = _outline(text, kind, mpl.rcParams["font.size"])
        at = Affine2D().translate(ox - extents.x0, oy - extents.y0).scale(1 / 72)
        at += ax.figure.dpi_scale_trans + ScaledTranslation(x, y, ax.transData)
        colour = LABEL_STYLES[kind].get("color", "black")
        if kind == "pause":
            patches.append(PathPatch(path, transform=at, fc="white", ec="white", lw=3))
        patches.append(PathPatch(path, transform=at, fc=colour, ec="none", gid="label"))
        boxes.append((text, (box[0], height - box[3], box[2], height - box[1])))
    return patches, boxes


def timeline(result, ax=None, *, lanes: int = 14):
    """Draw one run: a lane per worker, the fence's token in its own lane, the verdict as title.

    ``result`` is a Result, or anything with ``history``, ``violations``, ``verdict`` and
    ``params``. Beyond ``lanes`` workers it draws ``lanes - 1`` busy ones and a lane for the rest.

    >>> from labkit.scenarios import expired_but_alive
    >>> ax = timeline(expired_but_alive(protected=False))
    >>> [t.get_text() for t in ax.get_yticklabels()]
    ['A', 'B', 'fence']
    """
    lanes = lanes_of(result.history, check_number(lanes, "lanes", integer=True, low=2, high=500))
    if ax is None:
        import matplotlib.pyplot as plt

        fig = plt.figure()
        fit_figure(fig, len(lanes))
        ax = fig.add_subplot()
    xmax = x_range(end_of(result.history))
    frame(ax, lanes, xmax)
    sc = scene(result, lanes, xmax, point_in_data(ax))
    fill(add_artists(ax), sc)
    for patch in label_patches(ax, sc)[0]:
        ax.add_patch(patch)
    below = -72 * (_inch("bottom") - 0.12)  # points under the axes
    where = dict(xycoords="axes fraction", xytext=(0, below), textcoords="offset points")
    ax.annotate(sc.caption, (0, 0), **where, fontsize="small", color="#555555", va="bottom")
    wrap = int(88 * min(1.0, 12 / mpl.rcParams["font.size"]))  # the width stays; the font grows
    ax.set_title(textwrap.fill(sc.title, wrap), loc="left", color=sc.colour)
    return ax


#: the outcome map's outcomes, worst first after "no violation", and their colours
_OUTCOMES = ["no violation", "lost_update", "stale_accepted", "duplicate_effect"]
_OUTCOMES += ["interleaved", "foreign_release"]
_OUTCOME_COLOURS = ["#009E73", "#D55E00", "#E69F00", "#CC79A7", "#56B4E9", "#0072B2"]


def outcome_map(scenario, x, y, *, protected: bool = False, seed: int = 0, ax=None, **fixed):
    """Run ``scenario`` over a grid of two knobs and colour each cell by its worst violation.
    ``x`` and ``y`` are ``(knob, values)`` pairs; ``fixed`` holds other knobs fixed."""
    (xname, xs), (yname, ys) = x, y
    xs, ys = list(xs), list(ys)

    def worst(xv, yv) -> int:
        kinds = scenario(protected=protected, seed=seed, **{**fixed, xname: xv, yname: yv}).kinds
        return next((i for i, kind in enumerate(_OUTCOMES) if kind in kinds), 0)

    cells = [[worst(xv, yv) for xv in xs] for yv in ys]
    if ax is None:
        import matplotlib.pyplot as plt

        ax = plt.figure(figsize=(9, 4.5), layout="constrained").add_subplot()
    cmap = mpl.colors.ListedColormap(_OUTCOME_COLOURS)
    ax.imshow(cells, cmap=cmap, vmin=-0.5, vmax=len(_OUTCOMES) - 0.5, origin="lower", aspect="auto")
    ax.set_xticks(range(len(xs)), [f"{v:g}" for v in xs])
    ax.set_yticks(range(len(ys)), [f"{v:g}" for v in ys])
    xlabel, ylabel = (n if n in ("repeats", "contenders") else f"{n} (s)" for n in (xname, yname))
    ax.set(xlabel=xlabel, ylabel=ylabel)
    shown = sorted({c for row in cells for c in row})
    handles = [Patch(color=cmap(c), label=_OUTCOMES[c].replace("_", " ")) for c in shown]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    defaults = getattr(scenario, "knobs", {})
    if defaults.get(xname) in xs and defaults.get(yname) in ys:
        where = (xs.index(defaults[xname]), ys.index(defaults[yname]))
        style = dict(ha="center", va="center", fontsize="small", color="white", fontweight="bold")
        ax.text(*where, "the lesson's numbers", **style)
    mode = "protected" if protected else "unprotected"
    ax.set_title(f"{scenario.__name__}, {mode}: worst outcome per run", loc="left")
    return ax


def verdict_table(rows, *, verdicts=(1,), ax=None):
    """Draw rows of text (the first, a header, in bold) as a table with coloured verdict columns:
    in the ``verdicts`` columns "no violation" is green, any other text vermilion. BadArgument for
    no rows, rows of different lengths, or a ``verdicts`` index out of range."""
    rows = [tuple(map(str, row)) for row in rows]
    if not rows or len({len(row) for row in rows}) != 1:
        raise BadArgument("rows", "needs a header row and rows of the same length")
    columns = len(rows[0])
    if any(not 0 <= i < columns for i in verdicts):
        raise BadArgument("verdicts", f"column indexes must be in 0 .. {columns - 1}")
    widths = [max(map(len, column)) + 3 for column in zip(*rows)]
    starts = [sum(widths[:i]) / sum(widths) for i in range(columns)]
    big = mpl.rcParams["font.size"] / 10  # presenter mode: the text and the table grow
    if ax is None:
        import matplotlib.pyplot as plt

        size = (max(6.0, 0.132 * sum(widths)) * big, (0.45 * len(rows) + 0.4) * big)
        ax = plt.figure(figsize=size, layout="constrained").add_subplot()
    for y, row in enumerate(rows):
        for x, (start, text) in enumerate(zip(starts, row)):
            colour = COLOURS["accepted"] if text == "no violation" else COLOURS["rejected"]
            colour, weight = ("#222222", "bold") if y == 0 else (colour, "normal")
            colour = colour if x in verdicts else "#222222"
            ax.text(start, y, text, va="center", fontsize=13 * big, color=colour, weight=weight)
    ax.set(xlim=(0, 1), ylim=(len(rows) - 0.5, -0.5))
    ax.axis("off")
    return ax


#: 1.8x the fonts: text is then >= 1.5x on screen once Agg's hinting has rounded it (test_browser)
_PRESENTER = {"font.size": 18, "axes.titlesize": 21, "lines.linewidth": 3.0, "lines.markersize": 10}
_PRESENTER |= dict.fromkeys(["axes.labelsize", "xtick.labelsize", "ytick.labelsize"], 18)
_PRESENTER |= {"legend.fontsize": 18, "hatch.linewidth": 1.6, "axes.linewidth": 1.6}


class present:
    """Presenter mode for projecting: larger fonts, thicker lines, bigger markers.

    ``present()`` on, ``present(False)`` off; ``with present():`` restores the settings on exit.
    What is drawn keeps the mode it was drawn in; a panel made in a with block that the cell
    does not show is shown at the cell's end (as the inline backend shows a figure)."""

    _before: dict | None = None
    _made: list | None = None  # the panels made in the innermost with block

    def __init__(self, on: bool = True) -> None:
        self._saved = {k: mpl.rcParams[k] for k in _PRESENTER}
        if on:
            present._before = present._before or dict(self._saved)
            mpl.rcParams.update(_PRESENTER)
        elif present._before is not None:
            mpl.rcParams.update(present._before)
            present._before = None

    def __enter__(self) -> "present":
        self._outer, present._made = present._made, []
        return self

    def __exit__(self, *exc) -> None:
        import IPython

        mpl.rcParams.update(self._saved)
        if self._saved == present._before:
            present._before = None
        made, present._made, shell = present._made, self._outer, IPython.get_ipython()
        if exc[0] is not None or not made or shell is None:
            return

        at_end = getattr(shell, "parent_header", {}).get("msg_type") == "execute_request"

        def show() -> None:  # what the cell did not show itself, at its end (a button's: now)
            if at_end:
                shell.events.unregister("post_execute", show)
            IPython.display.display(*(panel for panel in made if not panel.shown))

        shell.events.register("post_execute", show) if at_end else show()
