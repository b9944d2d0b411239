"""The live view of a classroom (:mod:`labkit.engines.room`): 30 laptops, one picture a second.

A :class:`View` reads only what it draws: each :meth:`View.update` fetches the events after the
last id it has seen that fall in the window (the last ``window`` seconds of the server's log,
through its index on ``at``), and adds the server's per-student counts of the rows since the
last update (``GROUP BY`` in SQL) to its totals. So a redraw costs the window, never the log.

:func:`draw` draws a view with matplotlib's collections (one artist per kind, not per event):
a lane per student in alphabetical order, lease bars at least a few pixels wide, pauses hatched,
stale writes refused as red crosses, the fence as a step line over the lanes with at most eight
labels, and a title that counts students, writes, stale writes refused and pauses. It uses the
``Figure`` API, not pyplot, so :func:`watch` can draw from its own thread while the kernel
stays free (the next cell may pause students).

Hand-written rather than :func:`labkit.views.plot.timeline`: that one lays out every event of a
run with labels, which is right for a lesson's 30 events and far too slow for 100,000.
"""

from __future__ import annotations

import io
import threading
from collections import deque

import numpy as np
from matplotlib.collections import PolyCollection

from labkit.errors import BadArgument, check_number
from labkit.processes.live import room_history as history
from labkit.views.scene import COLOURS, SPAN_STYLES

__all__ = ["Picture", "View", "Watcher", "draw", "history", "png", "watch"]

LABELS = 8  # the fence's labels, at most
KEY = "bar: lease held · hatched: paused · ×: stale write refused · step: fence"


class View:
    """What the live picture of ``room`` shows: the rows of the last ``window`` seconds, and
    per-student totals (writes, stale writes refused, pauses) over the whole log."""

    def __init__(self, room, window: float = 20.0) -> None:
        self.room, self.window = room, check_number(window, "window", positive=True, high=3600)
        self.rows: deque = deque()
        self.last = self.tallied = 0
        self.end = float("-inf")  # the latest time seen: the window's right edge
        self.totals: dict[str, list[int]] = {}
        self.students: list[str] = []
        self.read = 0  # rows fetched by the last update: the window's new rows only

    def update(self) -> View:
        """Fetch what is new; drop what left the window. Returns the view."""
        new = self.room.window(self.last, self.window)
        self.read = len(new)
        if new:
            self.last = new[-1][0]
            self.end = max(self.end, max(r[1] for r in new))
            self.rows.extend(new)
        for student, writes, refused, pauses, last in self.room.tally(self.tallied, self.last):
            counts = self.totals.setdefault(student, [0, 0, 0])
            for i, n in enumerate((writes, refused, pauses)):
                counts[i] += n
        self.tallied = self.last
        start = self.end - self.window  # by time, not id: ids need not follow the server's clock
        self.rows = deque(r for r in self.rows if r[1] >= start)
        self.students = self.room.students()
        return self

    def title(self, protected: bool | None = None) -> str:
        writes, refused, pauses = (sum(c[i] for c in self.totals.values()) for i in range(3))
        mode = {True: "protected", False: "unprotected", None: ""}[protected]
        parts = [
            f"{len(self.students)} students",
            mode,
            f"{writes} writes",
            f"{refused} stale writes refused",
            f"{pauses} pauses",
        ]
        return " · ".join(p for p in parts if p)


def _spans(rows, start: float, end: float):
    """Leases ``{student: [(x, width)]}``, pauses likewise, refused writes ``[(x, student)]``,
    and the fence's steps ``[(x, generation)]``, from window rows (times from ``start``)."""
    leases, pauses, refused, fence = {}, {}, [], []
    held: dict[int, list] = {}  # generation -> [student, from, until]
    top = 0
    for _, at, _, who, action, outcome, gen, until in rows:
        x = at - start
        if action == "acquire" and outcome == "ok":
            held[gen] = [who, x, until - start]
        elif action == "renew" and outcome == "ok":
            held.setdefault(gen, [who, 0.0, 0.0])[2] = until - start
        elif action == "release" and gen in held:
            held[gen][2] = min(held[gen][2], x)
        elif action == "pause":
            pauses.setdefault(who, []).append((x, until - at))
        elif action == "write" and outcome == "rejected":
            refused.append((x, who))
        if action in ("acquire", "write") and outcome == "ok" and gen is not None and gen > top:
            top = gen
            fence.append((x, gen))
    for who, x0, x1 in held.values():
        leases.setdefault(who, []).append((x0, max(x1, x0) - x0))
    return leases, pauses, refused, fence


def draw(source, ax=None, *, protected: bool | None = None, window: float = 20.0):
    """Draw a room (or a :class:`View` of one, updated first) on ``ax`` (a new figure if None);
    return the lanes' axes. ``protected`` defaults to the room's setting."""
    view = source if isinstance(source, View) else View(source, window)
    return Picture(ax).show(view.update(), protected).ax


class Picture:
    """The artists of one room's picture, made once and given new data by :meth:`show`: a redraw
    lays out no text it laid out before (text layout is most of a redraw's cost)."""

    def __init__(self, ax=None) -> None:
        if ax is None:
            from matplotlib.figure import Figure

            ax = Figure(dpi=80).add_axes((0, 0, 1, 1))
            self.sized = False
        else:
            self.sized = True
        self.ax, self.lanes, self.labels = ax, None, []
        self.leases = ax.add_collection(PolyCollection([], **SPAN_STYLES["lease"]))
        self.pauses = ax.add_collection(PolyCollection([], **SPAN_STYLES["pause"]))
        self.refused = ax.scatter([], [], marker="x", s=36, color=COLOURS["rejected"], zorder=5)
        (self.fence,) = ax.step([], [], where="post", color=COLOURS["fence"], linewidth=2)
        fence_text = {"color": COLOURS["fence"], "fontweight": "bold"}
        mark = {"xytext": (2, 3), "textcoords": "offset points", "fontsize": "small", **fence_text}
        self.marks = [ax.annotate("", (0, 0), **mark) for _ in range(LABELS)]
        ax.set_yticks([])  # the lanes' names as plain texts: 30 ticks cost more than the data
        ax.grid(axis="x", alpha=0.3)
        below = {"xycoords": "axes fraction", "xytext": (0, -36), "textcoords": "offset points"}
        ax.annotate(KEY, (0, 0), **below, ha="left", va="top", fontsize="small", color="#555555")
        lane_axis = ax.get_yaxis_transform()
        ax.text(-0.005, -1.0, "fence", transform=lane_axis, ha="right", va="center", **fence_text)

    def show(self, view: View, protected: bool | None = None) -> Picture:
        """Give the artists ``view``'s data; return the picture."""
        ax = self.ax
        if protected is None and hasattr(view.room, "protected"):
            protected = view.room.protected
        if view.students != self.lanes:
            self._lanes(view)
        lanes = {name: i for i, name in enumerate(self.lanes)}
        end = view.end if view.rows else 0.0
        leases, pauses, refused, fence = _spans(view.rows, end - view.window, end)
        least = view.window / 250  # a lease is at least ~4 px wide at this width
        self.leases.set_verts(
            [_box(x, max(w, least), lanes[n], 0.38) for n in lanes for x, w in leases.get(n, [])]
        )
        self.pauses.set_verts(
            [_box(x, w, lanes[n], 0.3) for n in lanes for x, w in pauses.get(n, [])]
        )
        crosses = [(x, lanes[w]) for x, w in refused if w in lanes]
        self.refused.set_offsets(crosses or np.empty((0, 2)))
        self._fence(fence, view.window)
        ax.set_xlim(0, view.window)
        ax.set_xlabel(f"seconds (the last {view.window:g} s of the server's clock)")
        ax.set_title(view.title(protected), fontsize="large", loc="left", pad=12)
        return self

    def _lanes(self, view: View) -> None:
        """One lane per student, alphabetical, top down; the figure sized for them."""
        for label in self.labels:
            label.remove()
        self.lanes, ax = list(view.students), self.ax
        transform = ax.get_yaxis_transform()
        self.labels = [
            ax.text(-0.005, y, name, transform=transform, ha="right", va="center")
            for y, name in enumerate(self.lanes)
        ]
        ax.set_ylim(len(self.lanes) - 0.5, -1.75)  # the fence's band above the lanes
        if not self.sized:
            height = 1.9 + 0.26 * (max(len(self.lanes), 2) + 2)  # inches: title, fence, lanes
            ax.figure.set_size_inches(12, height)
            ax.set_position((0.09, 1.0 / height, 0.89, 1 - 1.6 / height))

    def _fence(self, steps, width: float) -> None:
        """The fence as a step line in the band above the lanes, with at most LABELS labels."""
        gens = [g for _, g in steps]
        xs = [x for x, _ in steps] + [width]
        low, high = (gens[0], max(gens[-1], gens[0] + 1)) if gens else (0, 1)
        ys = [-0.7 - 0.6 * (g - low) / (high - low) for g in gens]  # its labels stay inside
        self.fence.set_data(xs if gens else [], ys + ys[-1:])
        every = max(1, -(-len(steps) // LABELS))
        shown = list(range(0, len(steps), every))
        for mark, i in zip(self.marks, shown + [None] * LABELS):
            mark.set_visible(i is not None)
            if i is not None:
                mark.set_text(str(gens[i]))
                mark.xy = (xs[i], ys[i])


def _box(x: float, w: float, y: float, h: float) -> list:
    return [(x, y - h), (x + w, y - h), (x + w, y + h), (x, y + h)]


def png(ax) -> bytes:
    """The figure of ``ax`` as PNG bytes (Agg, no pyplot)."""
    buffer = io.BytesIO()
    ax.figure.savefig(buffer, format="png", pil_kwargs={"compress_level": 1})  # fast, not small
    return buffer.getvalue()


class Watcher:
    """A running :func:`watch`: ``redraws`` so far, ``seconds`` the last one took, ``error``
    if one failed; :meth:`stop` ends it."""

    def __init__(self, room, show, every: float, seconds: float | None, window: float) -> None:
        self.redraws, self.seconds, self.error, self.times = 0, None, None, []
        self.stopping = threading.Event()
        self.view, self.picture = View(room, window), None
        self.thread = threading.Thread(target=self._run, args=(show, every, seconds), daemon=True)
        self.thread.start()

    def _run(self, show, every, seconds) -> None:
        import time  # a live view: real time is what it shows

        began = time.monotonic()
        try:
            while not self.stopping.is_set():
                drawn = time.monotonic()
                self.picture = self.picture or Picture()
                show(png(self.picture.show(self.view.update()).ax))
                self.seconds = time.monotonic() - drawn
                self.times.append(self.seconds)
                self.redraws += 1
                if seconds is not None and time.monotonic() - began >= seconds:
                    break
                self.stopping.wait(max(0.0, every - self.seconds))
        except Exception as exc:  # shown on the handle; the kernel goes on
            self.error = exc
        finally:
            self.view.room.close()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)

    def __repr__(self) -> str:
        state = "running" if self.thread.is_alive() else "stopped"
        last = f", last {self.seconds:.2f} s" if self.seconds is not None else ""
        return f"<watching the room: {state}, {self.redraws} redraws{last}>"


def watch(
    room, seconds: float | None = None, *, every: float = 1.0, window: float = 20.0, show=None
) -> Watcher:
    """Redraw ``room`` every ``every`` seconds in the background (for ``seconds``, or until
    ``.stop()``) and return at once, so the next cell runs meanwhile. It reads through its own
    connection. ``show(png_bytes)`` defaults to one updated image in the notebook."""
    every = check_number(every, "every", positive=True, high=3600)
    if seconds is not None:
        seconds = check_number(seconds, "seconds", positive=True, high=86400)
    if not hasattr(room, "url"):
        raise BadArgument("room", f"must be a labkit.classroom.Room, got {type(room).__name__}")
    if show is None:
        from IPython.display import Image, display

        shown: list = []

        def show(data: bytes) -> None:  # one image in the cell's output, replaced each time
            if shown:
                shown[0].update(Image(data=data))
            else:
                shown.append(display(Image(data=data), display_id=True))

    return Watcher(type(room)(room.url), show, every, seconds, window)
