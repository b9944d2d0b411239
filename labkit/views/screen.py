"""A picture in a notebook that is redrawn in place, inside a ▶ button's output as well.

Why not the usual ways (both measured in JupyterLab 4 in Chromium, ipykernel 7):

* ``display(..., display_id=True)`` then ``handle.update(...)``: inside an ``ipywidgets.Output``,
  which is where a button shows what it does, the updates never arrive; the first frame stays.
* ``plt.show()`` in a button's callback: the figure JupyterLab received was drawn in part
  (0 to 5 % of the ink of the same call in a cell), on a pyplot figure in the inline backend.

A picture here is PNG bytes from :class:`~labkit.views.render.TimelineRenderer`, the path
every panel and replay draws through, set as an ``Output`` widget's ``outputs``: widget state,
which the frontend applies wherever the widget is shown.
"""

from __future__ import annotations

import base64
import html
import sys

import ipywidgets as widgets
import matplotlib as mpl

from labkit.views.render import _MODE, TimelineRenderer

__all__ = ["Screen", "enlarge", "png_output", "show", "verdict_html"]


def png_output(png: bytes) -> tuple:
    """``png`` as the one output of a ``widgets.Output``."""
    data = {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": "timeline"}
    return ({"output_type": "display_data", "metadata": {}, "data": data},)


def verdict_html(result) -> str:
    """``result``'s verdict as a line of HTML: ✗ in red with violations, else ✓ in green."""
    from labkit.views.scene import COLOURS

    colour, mark = (COLOURS["rejected"], "✗") if result.violations else (COLOURS["accepted"], "✓")
    return (
        f"<div style='font-size:115%;color:{colour};min-height:2.6em'><b>{mark}</b> "
        f"{html.escape(result.verdict)}</div>"
    )


def enlarge(box, mode: dict):
    """``box`` (a widget box) whose texts (labels, verdict, tables) grow as the ``mode``'s font
    (1.8x in presenter mode): a class on it and that class's style, in a hidden HTML child."""
    if (scale := mode["font.size"] / 10) > 1:  # 13, 28 and 300 px: ipywidgets' sizes
        name, size = f"labkit-text-{round(scale * 100)}", f"{13 * scale:g}px"
        css = f"font-size:{size};--jp-widgets-font-size:{size};--jp-widgets-inline-height:"
        css += f"{28 * scale:g}px;--jp-widgets-inline-width:{300 * scale:g}px;--jp-widgets-inline"
        css += "-width-short:calc(var(--jp-widgets-inline-width)/2 - 2px)"
        css = f"<style>.{name}{{{css}}} .{name} .widget-hbox{{flex-wrap:wrap}}</style>"
        box.add_class(name)
        box.children += (widgets.HTML(css, layout={"display": "none"}),)
    return box


class Screen:
    """A timeline and its verdict that :meth:`draw` replaces in place, in the mode (presenter or
    not) of the screen's making."""

    def __init__(self, min_height: str = "240px") -> None:
        self.image = widgets.Output(layout=widgets.Layout(min_height=min_height))
        self.verdict, self.mode = widgets.HTML(), {k: mpl.rcParams[k] for k in _MODE}
        self.box = enlarge(widgets.VBox([self.image, self.verdict]), self.mode)

    def draw(self, result) -> bytes:
        """Draw ``result`` (a Result, or anything :func:`.plot.timeline` takes) in place of the
        picture before; return its PNG bytes."""
        label = getattr(result, "xlabel", None) or "virtual time (s)"
        with mpl.rc_context(self.mode):
            png = TimelineRenderer([result], xlabel=label).png(result)
        self.image.outputs = png_output(png)
        self.verdict.value = verdict_html(result)
        return png

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.box)


def show(result) -> Screen:
    """Display ``result``'s timeline and verdict on a new :class:`Screen`; return it."""
    from IPython.display import display

    screen = Screen()
    screen.draw(result)
    if _in_ipython():
        display(screen)
    return screen


def _in_ipython() -> bool:
    ipython = sys.modules.get("IPython")
    return bool(ipython and ipython.get_ipython())
