"""The kernel's half of the presenter size test (``tests/test_browser.py``); its source is the first
cell of that test's notebook.

For one picture, :func:`probe` prints a line ``PROBE {json}``: the SHA-256 of the PNG the browser is
sent, and each text kind's boxes in that PNG's pixels (origin top left), from matplotlib's layout.
The browser then measures the ink inside each box in the image it shows; the digest proves that
the boxes belong to that image."""

import hashlib
import json

import matplotlib as mpl
from IPython.core.pylabtools import print_figure


def _ticks(axis) -> list:
    lo, hi = sorted(axis.get_view_interval())
    pairs = zip(axis.get_majorticklocs(), axis.get_majorticklabels())
    return [label for at, label in pairs if lo <= at <= hi and label.get_text()]


def _kinds(ax) -> dict:
    """Text kind -> [(artist, its text)] of one timeline axes."""
    kinds = {
        "legend": ax.get_legend().get_texts(),
        "ticks": _ticks(ax.xaxis) + _ticks(ax.yaxis),
        "axis label": [ax.xaxis.label],
        "title": [ax._left_title] if ax.get_title(loc="left") else [],
        "caption": list(ax.texts),
    }
    kinds = {kind: [(t, t.get_text()) for t in texts] for kind, texts in kinds.items()}
    kinds["labels"] = [(p, "") for p in ax.patches if p.get_gid() == "label"]
    return {kind: pairs for kind, pairs in kinds.items() if pairs}


def _boxes(pairs, renderer, left: float, top: float) -> list:
    """[x0, y0, x1, y1, lines] per artist, in the pixels of an image whose top left corner is at
    display point (left, top)."""
    boxes = []
    for artist, text in pairs:
        e = artist.get_window_extent(renderer)
        boxes.append([e.x0 - left, top - e.y1, e.x1 - left, top - e.y0, text.count("\n") + 1])
    return boxes


def timeline_probe(name: str, ax) -> None:
    """A pyplot timeline, as the inline backend will show it: cropped to its tight box."""
    fig = ax.figure
    png = print_figure(fig, "png", bbox_inches="tight")  # what the inline backend sends
    fig.canvas.draw()  # the legend's texts placed again in the figure's own pixels, not the crop's
    renderer = fig.canvas.get_renderer()
    tight = fig.get_tightbbox(renderer).padded(mpl.rcParams["savefig.pad_inches"])
    left, top = tight.x0 * fig.dpi, tight.y1 * fig.dpi
    size = [round(tight.width * fig.dpi), round(tight.height * fig.dpi)]
    boxes = {k: _boxes(pairs, renderer, left, top) for k, pairs in _kinds(ax).items()}
    _say(name, png, size, boxes)


def renderer_probe(name: str, renderer, result) -> None:
    """The last picture of a TimelineRenderer (a panel's or a replay's): the whole canvas."""
    png = renderer.png(result)
    with mpl.rc_context(renderer.mode):
        fig, ax = renderer._frame.figure, renderer._frame.ax
        drawer = fig.canvas.get_renderer()
        kinds = {k: v for k, v in _kinds(ax).items() if k != "labels"}
        boxes = {k: _boxes(pairs, drawer, 0, fig.bbox.height) for k, pairs in kinds.items()}
    boxes["labels"] = [[*box, 1] for _, box in renderer.label_boxes]
    _say(name, png, list(renderer.canvas.get_width_height()), boxes)


def _say(name: str, png: bytes, size: list, boxes: dict) -> None:
    digest = hashlib.sha256(png).hexdigest()
    print("PROBE", json.dumps({"name": name, "sha256": digest, "size": size, "boxes": boxes}))
