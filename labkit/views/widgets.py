"""Slider panels for notebooks: rerun a scenario on every change and redraw its timeline in place.

:func:`explore` builds an ipywidgets panel: a slider per knob, a seed slider,
a protected toggle, the verdict, the timeline and the resulting tables. Every
change reruns the scenario (a few milliseconds: virtual time, real SQLite) and
replaces the picture in place. The picture is an inline PNG inside a
``widgets.Output`` whose ``outputs`` are swapped in one state update: no
flicker, no stacked figures, and the layout does not move. The PNG comes from
a :class:`~labkit.views.widgets.TimelineRenderer`, which draws the frame once and only
the run's marks on every change.

:func:`replay` plays a scenario for an audience, paced in wall-clock time with
``simpy.rt.RealtimeEnvironment``, the timeline growing as it runs.
"""

from __future__ import annotations

import base64
import html
import os
import struct
import zlib

import ipywidgets as widgets
from IPython.display import display

from labkit.errors import BadArgument, BadArgumentType
from labkit.sim.history import check
from labkit.views.plot import (
    _MAX_LANES,
    COLOURS,
    LABEL_STYLES,
    SPAN_STYLES,
    _end,
    _frame,
    _lanes,
    _margins,
    _size,
    boxes,
    scene,
    styles,
)
from labkit.sim.engine import Result, play

__all__ = ["explore", "replay", "Explorer", "TimelineRenderer", "tables_html"]

#: knobs that get a slider by default, when the scenario has them
SLIDER_KNOBS = (
    "pause",
    "latency",
    "request_latency",
    "response_latency",
    "ttl",
    "margin",
    "gap",
    "hold",
    "drift",
    "offset",
    "delay",
    "lag",
    "repeats",
    "contenders",
    "outage",
)


_STEPS = (10, 15, 20, 30, 40, 50, 60, 80, 100, 120, 150, 200, 300, 400, 600, 1000)


class TimelineRenderer:
    """Draw many runs fast as PNG bytes (for the panel): same picture as :func:`labkit.views.plot.timeline`.

    The frame (lanes, ticks, legend) is rendered once per (lanes, time range)
    and kept as a background; each run then restores it and draws only its own
    marks with artists made once and refilled (blitting). Labels are drawn as
    cached glyph outlines, which costs a tenth of laying out text anew. The
    time range only grows, in round steps, so the picture does not jump while
    a slider moves. The verdict and knobs are left to the panel's HTML.

    Example:
        >>> from labkit.scenarios import expired_but_alive
        >>> TimelineRenderer().png(expired_but_alive())[:4]
        b'\\x89PNG'
    """

    def __init__(self, dpi: int = 80, xmax: float = 0.0, lanes=()) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.dpi, self.xmax, self.lanes = dpi, xmax, list(lanes)[:_MAX_LANES]
        self.figure = Figure(dpi=dpi)
        self.canvas = FigureCanvasAgg(self.figure)
        self.ax = self.figure.add_subplot()
        self._key = self._background = None
        self._paths: dict[tuple, tuple] = {}

    def _prepare(self, lanes: list[str], end: float) -> None:
        import matplotlib as mpl

        need = max(self.xmax, end * 1.03)
        xmax = next((s for s in _STEPS if s >= need), need * 1.1)
        key = (tuple(lanes), xmax, mpl.rcParams["font.size"], mpl.rcParams["lines.markersize"])
        if key == self._key:
            self.canvas.restore_region(self._background)
            return
        self.xmax = xmax
        self.figure.set_size_inches(*_size(len(lanes), top=0.25))  # no title: the panel shows it
        _margins(self.figure, top=0.25)
        self.ax.clear()
        _frame(self.ax, lanes, xmax)
        self.canvas.draw()
        self._background = self.canvas.copy_from_bbox(self.figure.bbox)
        self._artists = self._make_artists()
        self._key = key

    def _make_artists(self) -> dict:
        from matplotlib.collections import LineCollection, PolyCollection
        from matplotlib.lines import Line2D
        import matplotlib as mpl

        ax = self.ax

        def attach(artist):
            artist.set_figure(self.figure)
            artist.set_transform(ax.transData)
            artist.set_clip_box(ax.bbox)
            return artist

        made = {kind: attach(PolyCollection([], **style)) for kind, style in SPAN_STYLES.items()}
        made["ticks"] = attach(LineCollection([], colors=COLOURS["expiry"], linewidths=2.5))
        made["fence"] = attach(
            Line2D(
                [],
                [],
                color=COLOURS["fence"],
                drawstyle="steps-post",
                lw=mpl.rcParams["lines.linewidth"] * 1.5,
            )
        )
        for name, style in styles().items():
            made[name] = attach(Line2D([], [], ls="", **style))
        return made

    def _label(self, renderer, text, x, y, dy, kind) -> None:
        from matplotlib.font_manager import FontProperties
        from matplotlib.patches import PathPatch
        from matplotlib.textpath import TextPath
        from matplotlib.transforms import Affine2D
        import matplotlib as mpl

        style = LABEL_STYLES[kind]
        key = (text, style["fontsize"], style.get("fontweight"), mpl.rcParams["font.size"])
        if key not in self._paths:
            prop = FontProperties(size=style["fontsize"], weight=style.get("fontweight", "normal"))
            path = TextPath((0, 0), text, prop=prop)
            box = path.get_extents()
            self._paths[key] = (path, box.width, box.height)
        path, width, height = self._paths[key]
        ox = -width / 2 if style.get("ha") == "center" else 0.0
        va = style.get("va") or ("bottom" if dy > 0 else "top")
        oy = {"bottom": 0.0, "top": -height, "center": -height / 2}.get(va, 0.0)
        dx = 2.0 if kind in ("other", "fence") else 0.0
        px, py = self.ax.transData.transform((x, y))
        points = self.dpi / 72
        size = mpl.rcParams["lines.markersize"]
        move = Affine2D().translate(ox + dx, oy + dy * size).scale(points).translate(px, py)
        colour = style.get("color", "#000000")
        if kind == "pause":
            halo = PathPatch(path, transform=move, facecolor="white", edgecolor="white", lw=3)
            halo.set_figure(self.figure)
            halo.draw(renderer)
        patch = PathPatch(path, transform=move, facecolor=colour, edgecolor="none", lw=0)
        patch.set_figure(self.figure)
        patch.draw(renderer)

    def png(self, result) -> bytes:
        """Render ``result``'s timeline and return it as PNG bytes."""
        lanes = self.lanes + [w for w in _lanes(result.history) if w not in self.lanes]
        self.lanes = lanes = lanes[
            :_MAX_LANES
        ]  # lanes stay put once seen: the picture does not jump
        self._prepare(lanes, _end(result.history))
        sc = scene(result, lanes, self.xmax)
        renderer = self.canvas.get_renderer()
        art = self._artists
        for kind in SPAN_STYLES:
            art[kind].set_verts(boxes(sc.spans[kind]))
            art[kind].draw(renderer)
        art["ticks"].set_segments([[(x, y - 0.42), (x, y + 0.42)] for x, y in sc.ticks])
        art["ticks"].draw(renderer)
        art["fence"].set_data(*(sc.fence or ([], [])))
        art["fence"].draw(renderer)
        for name in styles():
            if name in sc.points:
                art[name].set_data(*sc.points[name])
                art[name].draw(renderer)
        for label in sc.labels:
            self._label(renderer, *label)
        return _encode(self.canvas)


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def _encode(canvas) -> bytes:
    """The canvas as an RGB PNG: no row filter, zlib level 1.

    Flat colours compress about as well this way as with adaptive filters, and
    it takes a third of the time of a general encoder.
    """
    import numpy as np

    pixels = np.asarray(canvas.buffer_rgba())
    height, width, _ = pixels.shape
    rows = np.zeros((height, 1 + 3 * width), np.uint8)  # byte 0 of each row: filter type 0
    rows[:, 1:].reshape(height, width, 3)[:] = pixels[:, :, :3]
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 1))
        + _chunk(b"IEND", b"")
    )


def tables_html(tables: dict, only=("invoices", "job_fence", "leases", "idempotency_keys")) -> str:
    """A small HTML rendering of a Result's tables (escaped), for the panel."""
    parts = []
    for name in only:
        rows = tables.get(name)
        if rows is None:
            continue
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in (rows[0] if rows else {}))
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>"
            for r in rows[:12]
        )
        more = f"<div>… {len(rows) - 12} more rows</div>" if len(rows) > 12 else ""
        empty = "<i>empty</i>" if not rows else ""
        parts.append(
            f"<div style='margin-right:1.5em'><b>{html.escape(name)}</b>{empty}"
            f"<table style='font-size:85%;border-collapse:collapse'><tr>{head}</tr>{body}</table>"
            f"{more}</div>"
        )
    return (
        "<div style='display:flex;flex-wrap:wrap;align-items:flex-start'>"
        + "".join(parts)
        + "</div>"
    )


def _verdict_html(result: Result) -> str:
    colour = COLOURS["rejected"] if result.violations else COLOURS["accepted"]
    mark = "✗" if result.violations else "✓"
    return (
        f"<div style='font-size:115%;color:{colour};min-height:2.6em'><b>{mark}</b> "
        f"{html.escape(result.verdict)}</div>"
    )


def _png_output(png: bytes) -> tuple:
    return (
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": "timeline"},
        },
    )


def _slider(name: str, spec, default):
    """Make the control for one knob from its spec: (low, high[, step]), a list of choices, or a value."""
    style = {"description_width": "9em"}
    layout = widgets.Layout(width="28em")
    if isinstance(spec, list):
        return widgets.Dropdown(
            options=spec,
            value=default if default in spec else spec[0],
            description=name,
            style=style,
            layout=layout,
        )
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise BadArgument(
            name, f"must be (low, high), (low, high, step) or a list of choices, got {spec!r}"
        )
    low, high, *step = spec
    value = min(max(default, low), high) if isinstance(default, (int, float)) else low
    if (
        isinstance(default, int)
        and not isinstance(default, bool)
        and all(isinstance(v, int) for v in (low, high))
    ):
        return widgets.IntSlider(
            value=value,
            min=low,
            max=high,
            step=step[0] if step else 1,
            description=name,
            style=style,
            layout=layout,
        )
    return widgets.FloatSlider(
        value=value,
        min=low,
        max=high,
        step=step[0] if step else 0.5,
        description=name,
        style=style,
        layout=layout,
        readout_format=".1f",
    )


def _default_spec(default):
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        return None
    if isinstance(default, int):
        return (max(0, min(1, default)), max(2 * default, 5), 1)
    return (0.0, float(max(2 * default, 10.0)), 0.5)


class Explorer(widgets.VBox):
    """The slider panel :func:`explore` returns (a ``VBox``).

    Attributes:
        scenario: the scenario function.
        controls: knob name -> its widget (plus ``"seed"`` and ``"protected"``).
        result: the :class:`~labkit.sim.engine.Result` of the latest run.
        image: the ``widgets.Output`` holding the timeline PNG.
    """

    def __init__(self, scenario, controls: dict, fixed: dict, dpi: int = 80) -> None:
        self.scenario, self.controls, self.fixed = scenario, controls, fixed
        longest, lanes = self._previews()
        self.renderer = TimelineRenderer(dpi=dpi, xmax=longest, lanes=lanes)
        self.result: Result | None = None
        name = getattr(scenario, "__name__", "scenario")
        summary = (scenario.__doc__ or "").strip().splitlines()[0] if scenario.__doc__ else ""
        self.title = widgets.HTML(f"<b>{html.escape(name)}</b> — {html.escape(summary)}")
        self.verdict = widgets.HTML()
        self.image = widgets.Output(layout=widgets.Layout(min_height="320px"))
        self.tables = widgets.HTML()
        knobs = [w for k, w in controls.items() if k not in ("seed", "protected")]
        side = widgets.VBox([controls["protected"], controls["seed"]])
        super().__init__(
            [
                self.title,
                widgets.HBox([widgets.VBox(knobs), side]),
                self.verdict,
                self.image,
                self.tables,
            ]
        )
        for control in controls.values():
            control.observe(self._changed, names="value")
        self.update()

    def _previews(self) -> tuple[float, list[str]]:
        """Run each slider at its far end: the longest run and every lane, so the frame rarely changes."""
        ends, lanes = [], []
        for name, control in self.controls.items():
            if name in ("seed", "protected") or not hasattr(control, "max"):
                continue
            for protected in (False, True):
                try:
                    run = self.scenario(protected=protected, **{**self.knobs(), name: control.max})
                except (BadArgument, BadArgumentType):
                    continue
                ends.append(_end(run.history))
                lanes += [w for w in _lanes(run.history) if w not in lanes]
        return max(ends, default=0.0) * 1.03, lanes

    def knobs(self) -> dict:
        """The knob values the controls show now (and the fixed ones)."""
        values = {k: w.value for k, w in self.controls.items() if k not in ("seed", "protected")}
        return {**self.fixed, **values}

    def _changed(self, _change) -> None:
        self.update()

    def update(self) -> Result | None:
        """Rerun the scenario with the controls' values and redraw everything in place."""
        try:
            self.result = self.scenario(
                protected=self.controls["protected"].value,
                seed=self.controls["seed"].value,
                **self.knobs(),
            )
        except (BadArgument, BadArgumentType) as exc:
            self.verdict.value = (
                f"<div style='color:{COLOURS['rejected']}'>{html.escape(str(exc))}</div>"
            )
            return None
        png = self.renderer.png(self.result)
        self.image.layout.min_height = f"{self.renderer.canvas.get_width_height()[1]}px"
        self.image.outputs = _png_output(png)
        self.verdict.value = _verdict_html(self.result)
        self.tables.value = tables_html(self.result.tables)
        return self.result


def explore(
    scenario, *, protected: bool = True, seed: int = 0, seeds: int = 20, dpi: int = 80, **sliders
) -> Explorer:
    """An ipywidgets panel that reruns ``scenario`` and redraws its timeline on every change.

    Args:
        scenario: a scenario function from :mod:`labkit.scenarios`.
        protected: the toggle's first position. seed: the seed slider's first value.
        seeds: the seed slider goes from 0 to this.
        dpi: the timeline's pixels per inch (more for a projector; each change costs more).
        **sliders: per knob, ``(low, high)`` or ``(low, high, step)`` for a slider, a list
            for a dropdown, or a plain value to hold it fixed. Sliders appear in the order
            named here; knobs not named get a default slider if they are timings or counts
            (``pause``, ``ttl``, ``gap``...).

    Returns:
        An :class:`Explorer` (a ``VBox``); show it as a cell's last expression.
        Sliders move with the mouse or the keyboard (arrow keys).

    Raises:
        BadArgument: a name that is not one of the scenario's knobs, or a bad spec.

    Example:
        >>> from labkit.scenarios import expired_but_alive
        >>> panel = explore(expired_but_alive, pause=(0, 60, 1), ttl=(5, 30, 1))
        >>> panel.controls["pause"].value = 5
        >>> panel.result.violations
        ()
    """
    knobs = getattr(scenario, "knobs", None)
    if knobs is None:
        raise BadArgumentType(
            "scenario", "must be a scenario function (made with labkit.sim.engine.scenario)"
        )
    if not isinstance(protected, bool):
        raise BadArgumentType("protected", f"must be True or False, got {type(protected).__name__}")
    for name in sliders:
        if name not in knobs:
            raise BadArgument(
                name, f"is not a knob of {scenario.__name__}; its knobs are {sorted(knobs)}"
            )
    controls, fixed = {}, {}
    for name in [*sliders, *(k for k in knobs if k not in sliders)]:  # the caller's order first
        default = knobs[name]
        spec = sliders.get(name, _default_spec(default) if name in SLIDER_KNOBS else None)
        if name in sliders and not isinstance(spec, (tuple, list)):
            fixed[name] = spec
        elif spec is None:
            fixed[name] = default
        else:
            controls[name] = _slider(name, spec, default)
    controls["seed"] = widgets.IntSlider(
        value=seed,
        min=0,
        max=max(seeds, seed),
        description="seed",
        style={"description_width": "4em"},
    )
    controls["protected"] = widgets.ToggleButton(
        value=protected,
        description="protected",
        tooltip="use the mechanism the lesson teaches",
        icon="shield",
    )
    if isinstance(dpi, bool) or not isinstance(dpi, int) or not 20 <= dpi <= 300:
        raise BadArgument("dpi", f"must be an int in 20 .. 300, got {dpi!r}")
    return Explorer(scenario, controls, fixed, dpi)


def _live_factor(virtual: float, speed: float) -> float:
    """Wall seconds per virtual second: ``1/speed``, capped by ``LABKIT_LIVE_SECONDS`` if set."""
    factor = 1.0 / speed
    cap = os.environ.get("LABKIT_LIVE_SECONDS")
    if cap:
        try:
            seconds = float(cap)
        except ValueError:
            raise BadArgument(
                "LABKIT_LIVE_SECONDS", f"must be a number of seconds, got {cap!r}"
            ) from None
        if seconds > 0 and virtual * factor > seconds:
            factor = seconds / virtual
    return factor


def replay(
    scenario,
    *,
    speed: float = 2.0,
    fps: float = 4.0,
    protected: bool = True,
    seed: int = 0,
    **knobs,
) -> Result:
    """Play ``scenario`` paced in wall-clock time, the timeline growing as it runs (for instructors).

    The same workers run on a ``simpy.rt.RealtimeEnvironment``: ``speed`` virtual
    seconds pass per wall second (``speed=1`` is real time). The panel is shown
    at once and redrawn ``fps`` times a second. If the environment variable
    ``LABKIT_LIVE_SECONDS`` is set, the whole replay is sped up to fit in that many
    seconds (tests and the browser run use it).

    Returns:
        The final :class:`~labkit.sim.engine.Result` (the same as an unpaced run's).

    Example (in a notebook cell; about 17 s of wall time at ``speed=2``)::

        from labkit.scenarios import expired_but_alive
        replay(expired_but_alive, protected=False, speed=2)
    """
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not speed > 0:
        raise BadArgument("speed", f"must be a number > 0, got {speed!r}")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0:
        raise BadArgument("fps", f"must be a number > 0, got {fps!r}")
    preview = scenario(protected=protected, seed=seed, **knobs)  # validates knobs; gives the length
    factor = _live_factor(max(_end(preview.history), 1.0), float(speed))
    renderer = TimelineRenderer(xmax=_end(preview.history) * 1.03, lanes=_lanes(preview.history))
    clock = widgets.HTML()
    image = widgets.Output(layout=widgets.Layout(min_height="320px"))
    verdict = widgets.HTML()
    display(widgets.VBox([clock, image, verdict]))
    params = {**scenario.knobs, **knobs, "protected": protected, "seed": seed}

    def step(sim) -> None:
        history = tuple(sim.history)
        partial = Result(params, history, {}, tuple(check(history)), "")
        image.outputs = _png_output(renderer.png(partial))
        clock.value = f"<b>live</b> t = {sim.env.now:5.1f} s (virtual), ×{1 / factor:.1f}"

    result = play(
        scenario,
        protected=protected,
        seed=seed,
        factor=factor,
        every=max(1.0 / (fps * factor), 0.05),
        step=step,
        **knobs,
    )
    image.outputs = _png_output(renderer.png(result))
    verdict.value = _verdict_html(result)
    return result
