"""The timeline renderer: a run's picture as PNG bytes, fast enough for a slider.

Every panel, replay, live demo and engine run draws through it (``widgets``, ``screen``).
"""

from __future__ import annotations

import struct
import zlib

import matplotlib as mpl
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from labkit.views import plot
from labkit.views.plot import add_artists, fill, fit_figure, frame, label_patches, point_in_data
from labkit.views.scene import end_of, lanes_of, merge_lanes, scene, x_range

__all__ = ["TimelineRenderer"]


#: the settings a picture depends on besides its run: presenter mode changes them
_MODE = tuple(plot._PRESENTER)


class _Frame:
    """One figure for one (lanes, mode): its frame drawn once, its time axes kept per range."""

    def __init__(self, lanes: list[str], xmax: float, xlabel: str) -> None:
        big = mpl.rcParams["font.size"] > 10  # presenter mode: the pixels an inch of timeline()
        # opaque whatever the rcParams say: the PNG is RGB
        self.figure = Figure(dpi=mpl.rcParams["figure.dpi"] if big else 80, facecolor="white")
        self.canvas = FigureCanvasAgg(self.figure)
        self.ax = self.figure.add_subplot()
        fit_figure(self.figure, len(lanes), top=0.25)  # the panel shows the title
        frame(self.ax, lanes, xmax, xlabel)
        self.ax.xaxis.set_animated(True)
        self.artists = add_artists(self.ax, animated=True)
        self.canvas.draw()
        self.background = self.canvas.copy_from_bbox(self.figure.bbox)
        size = max(t.get_fontsize() for t in self.ax.get_legend().get_texts())
        self.legend_text_px = size * self.figure.dpi / 72
        self.ranges: dict = {}

    def show_range(self, xmax: float) -> None:
        """Set the time axis to ``xmax`` (always: the limits place every artist) and put its
        pixels in the canvas, from the cache when this range was drawn before."""
        self.ax.set_xlim(-0.02 * xmax, xmax)
        if xmax in self.ranges:
            return self.canvas.restore_region(self.ranges[xmax])
        self.canvas.restore_region(self.background)
        self.ax.draw_artist(self.ax.xaxis)
        if len(self.ranges) >= 8:  # about 1 MB each
            self.ranges.pop(next(iter(self.ranges)))
        self.ranges[xmax] = self.canvas.copy_from_bbox(self.figure.bbox)


class TimelineRenderer:
    """Draw many runs fast as PNG bytes (for the panel): the picture of :func:`.plot.timeline`.

    A picture is a function of the run, the lanes reserved here and the mode (presenter or not,
    taken when the renderer is made): the same run gives the same bytes whatever was drawn
    before. Caches only save time: a figure per (lanes, mode) whose frame is drawn once, and its
    time axis per range. ``runs`` (or ``lanes``) reserve lanes, so that the picture keeps its
    size while a slider moves; ``xmax`` fixes the range. After :meth:`png`: ``label_boxes``,
    ``[(text, (x0, y0, x1, y1))]``, and ``legend_text_px``, the legend's em, both in image pixels
    (origin top left)."""

    def __init__(
        self, runs=(), *, xmax: float | None = None, lanes=(), xlabel: str = "virtual time (s)"
    ) -> None:
        self.xlabel = xlabel
        self.reserved = list(lanes)
        for run in runs:
            self.reserved = merge_lanes(self.reserved, lanes_of(run.history))
        self.lanes, self.hold, self.xmax = list(self.reserved), xmax, None
        self.mode = {k: mpl.rcParams[k] for k in _MODE}
        self._frames: dict = {}
        self._frame: _Frame | None = None
        self.label_boxes, self.legend_text_px = [], 0.0

    @property
    def canvas(self):
        """The canvas of the last picture."""
        return self._frame.canvas

    def png(self, result) -> bytes:
        """Render ``result``'s timeline and return it as PNG bytes."""
        with mpl.rc_context(self.mode):
            ran = {e.worker for e in result.history}  # no lane for a worker not in this run
            kept = [w for w in self.reserved if w in ran]
            self.lanes = merge_lanes(kept, lanes_of(result.history))
            self.xmax = self.hold or x_range(end_of(result.history))
            key = tuple(self.lanes)
            if key not in self._frames:
                if len(self._frames) >= 4:
                    self._frames.pop(next(iter(self._frames)))
                self._frames[key] = _Frame(self.lanes, self.xmax, self.xlabel)
            self._frame = frame_ = self._frames[key]
            self.legend_text_px = frame_.legend_text_px
            frame_.show_range(self.xmax)
            sc = scene(result, self.lanes, self.xmax, point_in_data(frame_.ax))
            patches, self.label_boxes = label_patches(frame_.ax, sc)
            for artist in fill(frame_.artists, sc) + patches:
                artist.set_figure(frame_.figure)
                frame_.ax.draw_artist(artist)
            return _png(np.asarray(frame_.canvas.buffer_rgba()))


def _png(rgba) -> bytes:
    """``rgba``'s pixels as an RGB PNG, unfiltered, at zlib level 1: half of Pillow's time on a
    panel (2.7 against 5.4 ms), which filters every row adaptively and has no switch to stop."""
    height, width, _ = rgba.shape
    rows = np.zeros((height, 1 + 3 * width), np.uint8)  # each row: filter 0, then R G B ...
    rows[:, 1:] = rgba[..., :3].reshape(height, -1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    head = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    body = chunk(b"IDAT", zlib.compress(rows.tobytes(), 1)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + head + body
