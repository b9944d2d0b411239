"""Slider panels for notebooks: rerun a scenario on every change and redraw its timeline in place.

The timeline is a PNG in a ``widgets.Output`` whose ``outputs`` are swapped in one update, so
nothing flickers. :func:`replay` plays a run paced in wall-clock time (``simpy.rt``)."""

import asyncio
import contextlib
import html
import math
import os
import re
from collections import OrderedDict

import ipywidgets as widgets
from IPython.display import display
from tabulate import tabulate

from labkit.errors import BadArgument, BadArgumentType, LabkitError, check_number
from labkit.sim.engine import POSITIVE_KNOBS, Result, play
from labkit.sim.history import check
from labkit.views.plot import present
from labkit.views.render import TimelineRenderer
from labkit.views.screen import enlarge, png_output, verdict_html
from labkit.views.scene import COLOURS, end_of, x_range

__all__ = ["explore", "replay", "button", "Explorer", "TimelineRenderer", "tables_html"]

#: knobs that get a slider by default, when the scenario has them
SLIDER_KNOBS = frozenset(
    "pause latency request_latency response_latency ttl margin gap hold drift offset delay lag"
    " repeats contenders outage".split()
)
_FIXED = ("seed", "protected")  # the controls every panel has
_LIVE = "LABKIT_LIVE_SECONDS"  # if set, caps a whole replay at that many wall seconds


def tables_html(tables: dict, only=("invoices", "job_fence", "leases", "idempotency_keys")) -> str:
    """A Result's tables as escaped HTML tables (12 rows each), side by side, for the panel."""
    parts = []
    for name in (n for n in only if n in tables):
        rows = [{k: _readable(v) for k, v in row.items()} for row in tables[name]]
        shown = tabulate(
            rows[:12], "keys", "html", disable_numparse=True, stralign=None, numalign=None
        ).replace("<table>", "<table style='border-collapse:collapse'>")
        shown = re.sub(r"<(t[dh])>", r"<\1 style='padding:0.1em 0.6em'>", shown)
        more = f"<div>… {len(rows) - 12} more rows</div>" if len(rows) > 12 else ""
        parts.append(
            f"<div style='margin-right:1.5em;font-size:85%'><div><b>{html.escape(name)}</b></div>"
            f"{shown if rows else '<i>empty</i>'}{more}</div>"
        )
    return f"<div style='display:flex;flex-wrap:wrap;align-items:flex-start'>{''.join(parts)}</div>"


def _readable(value):
    """A table's float as the eye reads it (6 significant digits): 20, not 19.999999999999996."""
    return f"{value:.6g}" if isinstance(value, float) else value


def _control(name: str, spec, default):
    """The control for one knob from its spec: (low, high[, step]) or a list of choices."""
    common = dict(description=name, style={"description_width": "9em"}, layout={"width": "28em"})
    if isinstance(spec, list):
        value = default if default in spec else spec[0]
        return widgets.Dropdown(options=spec, value=value, **common)
    if len(spec) not in (2, 3):
        raise BadArgument(name, f"must be (low, high[, step]) or a list of choices, got {spec!r}")
    low, high, *step = spec
    value = min(max(default, low), high) if isinstance(default, (int, float)) else low
    whole = isinstance(default, int) and not isinstance(default, bool)
    if whole and all(isinstance(v, int) for v in (low, high)):
        return widgets.IntSlider(value=value, min=low, max=high, step=(step or [1])[0], **common)
    common.update(readout_format=".1f", step=(step or [0.5])[0])
    return widgets.FloatSlider(value=value, min=low, max=high, **common)


def _default_spec(name: str, default):
    """A slider range for a timing or count knob with this default (None: not a number); a
    length of time that means nothing at zero starts a step above it."""
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        return None
    if isinstance(default, int):
        return (max(0, min(1, default)), max(2 * default, 5), 1)
    return (0.5 if name in POSITIVE_KNOBS else 0.0, float(max(2 * default, 10.0)), 0.5)


class Explorer(widgets.VBox):
    """The slider panel of :func:`explore`: ``controls`` (knob -> widget, then seed and
    protected), ``result`` (the latest run) and ``image`` (the Output holding the PNG)."""

    def __init__(self, scenario, controls: dict, fixed: dict) -> None:
        self.scenario, self.controls, self.fixed = scenario, controls, fixed
        self.reserved = TimelineRenderer(self._previews()).reserved  # fixed for the panel
        self._renderers = [TimelineRenderer(lanes=self.reserved) for _ in "12"]  # shown, ahead
        self.result, self._drawn, self._pictures = None, None, OrderedDict()
        summary = html.escape(((scenario.__doc__ or "").strip().splitlines() or [""])[0])
        summary = re.sub(r"``(.+?)``", r"<code>\1</code>", summary)  # the docstring's literals
        self.title = widgets.HTML(f"<b>{html.escape(scenario.__name__)}</b> — {summary}")
        self.verdict, self.tables = widgets.HTML(), widgets.HTML()
        self.image = widgets.Output(layout=widgets.Layout(min_height="320px"))
        knobs = widgets.VBox([w for k, w in controls.items() if k not in _FIXED])
        side = widgets.VBox([controls["protected"], controls["seed"]])
        top = widgets.HBox([knobs, side])
        super().__init__([self.title, top, self.verdict, self.image, self.tables])
        enlarge(self, self.renderer.mode)
        self.shown = False  # made in a `with present():` block, it is shown at the cell's end
        if present._made is not None:
            present._made.append(self)
        for control in controls.values():
            control.observe(self._moved, names="value")
        self.update()

    def _repr_mimebundle_(self, **kwargs):
        self.shown = True
        return super()._repr_mimebundle_(**kwargs)

    def _previews(self) -> list:
        """Runs with each slider at its far end, so the renderer reserves their lanes."""
        runs = []
        for name, control in self.controls.items():
            if name in _FIXED or not hasattr(control, "max"):
                continue
            at_end = {**self.knobs(), name: control.max}
            for protected in (False, True):
                try:
                    runs.append(self.scenario(protected=protected, **at_end))
                except LabkitError:  # that end is refused: it has no lanes to reserve
                    continue
        return runs

    def knobs(self) -> dict:
        """The knob values the controls show now (and the fixed ones)."""
        values = {k: w.value for k, w in self.controls.items() if k not in _FIXED}
        return {**self.fixed, **values}

    def update(self) -> Result | None:
        """Rerun with the controls' values, redraw in place; ``scenario.naive`` is shown when off."""
        seed, protected = self.controls["seed"].value, self.controls["protected"].value
        self.controls["protected"].description = f"protection: {'ON' if protected else 'OFF'}"
        for name, value in getattr(self.scenario, "naive", {}).items():  # off: naive; on: default
            if name in self.controls and (self.controls[name].value == value) == protected:
                self.controls[name].value = self.scenario.knobs[name] if protected else value
        try:
            self.result, png, height = self._picture(self.knobs(), self._renderers[0])
        except LabkitError as exc:  # a refusal in words, and no picture of other knobs
            self.result = None
            error = html.escape(f"{type(exc).__name__}: {exc}")
            self.verdict.value = f"<div style='color:{COLOURS['rejected']}'>{error}</div>"
            self.image.outputs, self.tables.value = (), ""
            return None
        self.image.layout.min_height = f"{height}px"
        self.image.outputs = png_output(png)
        self.verdict.value = verdict_html(self.result)
        self.tables.value = tables_html(self.result.tables)
        return self.result

    @property
    def renderer(self) -> TimelineRenderer:
        """The panel's renderer, its last picture the one shown (drawn again if that came from
        the panel's pictures, so that its canvas and label boxes are the shown picture's)."""
        if self.result is not None and self._drawn is not self.result:
            self._renderers[0].png(self.result)
            self._drawn = self.result
        return self._renderers[0]

    def _picture(self, knobs: dict, renderer: TimelineRenderer) -> tuple:
        """``(result, png, height)`` of ``knobs`` at the controls' seed and protection: from the
        last drawn (32, and 20,000 events: a herd of 500 is 4,000), or run and drawn by
        ``renderer`` (a picture depends on its run alone)."""
        seed, protected = self.controls["seed"].value, self.controls["protected"].value
        key = (seed, protected, tuple(knobs.items()))
        if key not in self._pictures:
            result = self.scenario(protected=protected, seed=seed, **knobs)
            png, (_, height) = renderer.png(result), renderer.canvas.get_width_height()
            self._drawn = result if renderer is self._renderers[0] else self._drawn
            self._pictures[key] = (result, png, height)
        self._pictures.move_to_end(key)
        kept = list(self._pictures.values())
        while len(kept) > 1 and (len(kept) > 32 or sum(len(r.history) for r, *_ in kept) > 20_000):
            self._pictures.popitem(last=False)
            kept.pop(0)
        return self._pictures[key]

    def _moved(self, change) -> None:
        """A control moved: show its run; if a slider moved one step (an arrow key), draw the
        picture one more step the same way once this message is done, before the next one is
        read, so that the next press finds it drawn (a drag's jumps draw nothing ahead)."""
        self.update()
        name, slider = next(k for k, c in self.controls.items() if c is change.owner), change.owner
        sliding = isinstance(slider, (widgets.IntSlider, widgets.FloatSlider))
        if (
            name not in _FIXED
            and sliding
            and math.isclose(abs(change.new - change.old), slider.step)
        ):
            further = min(max(round(2 * change.new - change.old, 9), slider.min), slider.max)
            with contextlib.suppress(RuntimeError):  # no event loop: a plain script or a test
                asyncio.get_running_loop().call_soon(self._ahead, {**self.knobs(), name: further})

    def _ahead(self, knobs: dict) -> None:
        with contextlib.suppress(LabkitError):  # refused: the press will say so
            self._picture(knobs, self._renderers[1])


def explore(scenario, *, protected: bool = True, seed: int = 0, **sliders) -> Explorer:
    """An ipywidgets panel (an :class:`Explorer`) that reruns ``scenario`` on every change.

    ``sliders`` give per knob ``(low, high[, step])`` for a slider, a list for a dropdown or a
    value to hold it fixed, in the order shown; other timings and counts get a default slider.

    >>> from labkit.scenarios import expired_but_alive
    >>> panel = explore(expired_but_alive, pause=(0, 60, 1), ttl=(5, 30, 1))
    >>> panel.controls["pause"].value = 5
    >>> panel.result.violations
    ()
    """
    knobs = getattr(scenario, "knobs", None)
    if knobs is None:
        raise BadArgumentType("scenario", "must be a scenario function, see labkit.scenarios")
    if not isinstance(protected, bool):
        raise BadArgumentType("protected", f"must be True or False, got {type(protected).__name__}")
    for name in sliders:
        if name not in knobs:
            raise BadArgument(name, f"is not one of {scenario.__name__}'s knobs {sorted(knobs)}")
    controls, fixed = {}, {}
    for name in [*sliders, *(k for k in knobs if k not in sliders)]:  # the caller's order first
        default = knobs[name]
        spec = sliders.get(name, _default_spec(name, default) if name in SLIDER_KNOBS else None)
        if isinstance(spec, (tuple, list)):
            controls[name] = _control(name, spec, default)
        else:
            fixed[name] = default if spec is None and name not in sliders else spec
    seed_style = {"description_width": "4em"}
    controls["seed"] = widgets.IntSlider(
        value=seed, min=0, max=max(20, seed), description="seed", style=seed_style
    )
    tip = "use the mechanism the lesson teaches"
    controls["protected"] = widgets.ToggleButton(
        value=protected, description="protected", icon="shield", tooltip=tip
    )
    return Explorer(scenario, controls, fixed)


def button(label: str, action) -> widgets.VBox:
    """A button that runs ``action()`` when clicked and shows its output and value under it
    (for instructor cells: a student's Run All only draws the button)."""
    if not callable(action):
        raise BadArgumentType("action", f"must be a function to call, got {type(action).__name__}")
    press = widgets.Button(description=label, button_style="info", layout={"width": "auto"})
    shown = widgets.Output()

    def run(_press) -> None:
        press.disabled = True
        try:
            with shown:
                shown.clear_output()
                value = action()
                if isinstance(value, str):
                    print(value)  # a story in words, not its repr
                elif value is not None:
                    display(value)
        finally:
            press.disabled = False

    press.on_click(run)
    return widgets.VBox([press, shown])


def replay(
    scenario, *, speed: float = 2.0, protected: bool = True, seed: int = 0, **knobs
) -> Result:
    """Play ``scenario`` paced in wall-clock time, the timeline growing as it runs (for instructors).

    ``speed`` virtual seconds pass per wall second (``$LABKIT_LIVE_SECONDS`` caps the whole
    replay); returns the final Result, equal to an unpaced run's."""
    speed = check_number(speed, "speed", positive=True)
    preview = scenario(protected=protected, seed=seed, **knobs)  # validates knobs; gives the length
    virtual, cap = max(end_of(preview.history), 1.0), float(os.environ.get(_LIVE) or 0)
    factor = cap / virtual if 0 < cap < virtual / speed else 1.0 / speed  # wall s per virtual s
    renderer = TimelineRenderer([preview], xmax=x_range(virtual))
    clock, verdict = widgets.HTML(), widgets.HTML()
    image = widgets.Output(layout=widgets.Layout(min_height="320px"))
    display(enlarge(widgets.VBox([clock, image, verdict]), renderer.mode))
    params = {**scenario.knobs, **knobs, "protected": protected, "seed": seed}

    def step(sim) -> None:
        history = tuple(sim.history)
        partial = Result(params, history, {}, tuple(check(history)), "")
        image.outputs = png_output(renderer.png(partial))
        clock.value = f"<b>live</b> t = {sim.env.now:5.1f} s (virtual), ×{1 / factor:.1f}"

    every = max(0.25 / factor, 0.05)  # four pictures a wall second
    result = play(
        scenario, protected=protected, seed=seed, factor=factor, every=every, step=step, **knobs
    )
    image.outputs = png_output(renderer.png(result))
    verdict.value = verdict_html(result)
    return result
