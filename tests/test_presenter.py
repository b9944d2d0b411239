"""Presenter mode: every text of every picture kind is >= 1.5x as large on screen, a picture
keeps the mode it was made in, and a panel made in a ``with present():`` block is shown.

The browser half (what Chromium shows at 1400 px) is in test_browser.py; here, the figures'
own font sizes, in the pixels a notebook output shows them at."""

import base64
import re

import IPython
import matplotlib
import pytest
from IPython.core.events import EventManager

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.text import Text

from labkit.scenarios import expired_but_alive
from labkit.views.plot import outcome_map, present, timeline, verdict_table
from labkit.views.render import TimelineRenderer
from labkit.views.scene import end_of, x_range
from labkit.views.screen import Screen
from labkit.views.widgets import explore

#: a notebook output's width in CSS px in a 1400 px JupyterLab window (test_browser measures it);
#: a wider image is scaled down to it
OUTPUT_PX = 967
RUN = expired_but_alive(protected=False)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")
    present(False)


def _texts(fig, width_px: float) -> dict[str, float]:
    """Each shown text of ``fig`` (words joined by one space) -> its font size in screen px."""
    shown = min(1.0, OUTPUT_PX / width_px) * fig.dpi / 72
    found = {}
    for text in fig.findobj(Text):
        words = " ".join(text.get_text().split())
        if words and text.get_visible():
            found[words] = max(found.get(words, 0), text.get_fontsize() * shown)
    return found


def _inline(ax) -> dict[str, float]:
    """A pyplot figure as the inline backend shows it: cropped to its tight box."""
    fig = ax.figure
    fig.canvas.draw()
    tight = fig.get_tightbbox(fig.canvas.get_renderer()).padded(0.1)
    width = tight.width * fig.dpi
    return {**_texts(fig, width), "scale": min(1.0, OUTPUT_PX / width)}


def _labels(boxes, width_px: float) -> dict[str, float]:
    """A timeline's labels (glyph outlines, not Text) -> their height in screen px."""
    return {f"label {t}": (y1 - y0) * min(1.0, OUTPUT_PX / width_px) for t, (_, y0, _, y1) in boxes}


def _renderer(renderer) -> dict[str, float]:
    renderer.png(RUN)
    width = renderer.canvas.get_width_height()[0]
    return {**_texts(renderer._frame.figure, width), **_labels(renderer.label_boxes, width)}


def _timeline_sizes() -> dict[str, float]:
    ax = timeline(RUN)
    found = _inline(ax)  # draws it
    scale = found.pop("scale")
    labels = [p for p in ax.patches if p.get_gid() == "label"]  # in the order of the scene's
    return {
        **found,
        **{f"label {i}": p.get_window_extent().height * scale for i, p in enumerate(labels)},
    }


#: every picture kind -> the sizes of its texts, drawn in the current mode
KINDS = {
    "timeline": _timeline_sizes,
    "panel": lambda: _renderer(explore(expired_but_alive, protected=False).renderer),
    "replay": lambda: _renderer(TimelineRenderer([RUN], xmax=x_range(end_of(RUN.history)))),
    "outcome_map": lambda: _inline(
        outcome_map(expired_but_alive, ("pause", [0, 5, 30]), ("ttl", [5, 10]))
    ),
    "verdict_table": lambda: _inline(
        verdict_table([("scenario", "naive"), ("expired_but_alive", "lost update")])
    ),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_presenter_mode_draws_every_text_half_again_as_large_on_screen(kind):
    """Every text of the picture (legend, tick and axis labels, title, caption, the timeline's
    own labels, a table's cells) is >= 1.5x its normal size in a 1400 px window's output."""
    normal = KINDS[kind]()
    with present():
        big = KINDS[kind]()
    normal.pop("scale", None), big.pop("scale", None)
    assert len(normal) >= 3 and set(normal) <= set(big), set(normal) ^ set(big)
    small = {t: round(big[t] / px, 2) for t, px in normal.items() if big[t] < 1.5 * px}
    assert not small, f"{kind}: enlarged less than 1.5x: {small}"


def test_presenter_mode_enlarges_the_html_of_panels_replays_and_screens():
    """The verdict, tables, slider labels and clock grow with the font: a panel or screen made in
    presenter mode carries a class whose style sets the widgets' font 1.5x or more."""
    normal, screen = explore(expired_but_alive), Screen()
    with present():
        big, big_screen = explore(expired_but_alive), Screen()
    for box in (normal, screen.box):
        assert not box._dom_classes and not any(
            "<style>" in getattr(c, "value", "") for c in box.children
        )
    for box in (big, big_screen.box):
        (name,) = box._dom_classes
        (style,) = [c.value for c in box.children if "<style>" in getattr(c, "value", "")]
        assert f".{name}{{" in style and box.children[-1].layout.display == "none"
        sizes = re.findall(r"--jp-widgets-font-size:([\d.]+)px", style)
        assert sizes and float(sizes[0]) >= 1.5 * 13  # ipywidgets' own: 13 px


def test_a_picture_drawn_outside_presenter_mode_stays_as_it_is():
    """``present()`` in a later cell changes no panel or screen made before it: moving a slider
    draws what a fresh normal renderer draws, and a screen redraws in its own mode."""
    panel, screen = explore(expired_but_alive, protected=False), Screen()
    present()
    panel.controls["pause"].value = 5  # moved while presenter mode is on
    present(False)
    shown = base64.b64decode(panel.image.outputs[0]["data"]["image/png"])
    assert shown == TimelineRenderer(lanes=panel.reserved).png(panel.result)
    normal = TimelineRenderer([RUN]).png(RUN)
    present()
    assert screen.draw(RUN) == normal != TimelineRenderer([RUN]).png(RUN)
    present(False)
    assert not panel._dom_classes and not screen.box._dom_classes


class _Shell:
    """What present() needs of a kernel's shell: the message being run, and events."""

    def __init__(self, msg_type: str) -> None:
        self.parent_header = {"msg_type": msg_type}
        self.events = EventManager(self, {"post_execute": None})


@pytest.fixture
def shown(monkeypatch):
    """The objects display() was given."""
    seen = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs: seen.extend(objs))
    return seen


def test_a_panel_made_in_a_with_block_is_shown_at_the_cells_end_once(monkeypatch, shown):
    """In a cell, a panel made in ``with present():`` is shown when the cell ends, unless the
    cell showed it itself; in a button's callback it is shown at once."""
    shell = _Shell("execute_request")
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    with present():
        alone = explore(expired_but_alive)
        named = explore(expired_but_alive)
    assert shown == []
    named._repr_mimebundle_()  # the cell's last line, `named`, shows it
    shell.events.trigger("post_execute")
    shell.events.trigger("post_execute")  # the next cell's end shows nothing again
    assert shown == [alone]
    monkeypatch.setattr(IPython, "get_ipython", lambda: _Shell("comm_msg"))
    with present():
        clicked = explore(expired_but_alive)
    assert shown == [alone, clicked]
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # a plain script: nothing to show
    with present():
        explore(expired_but_alive)
    outside = explore(expired_but_alive)  # made outside a with block: the cell shows it or not
    assert shown == [alone, clicked] and not outside.shown
