"""Live: real worker processes on one SQLite file, in real time, in front of an audience.

A :class:`~labkit.processes.team.Team` starts the invoice workers of :mod:`labkit.processes.workers`
as OS processes and gives you the hands to freeze, thaw, kill and restart
them (it is exported here too). :class:`Demo` adds timed pauses and a
timeline that redraws while it runs; :func:`run_demo` plays the whole story in
one cell. Every process is stopped when the demo ends, when the cell is
interrupted and at interpreter exit (see :mod:`labkit.processes.team`).

This module reads the real clock on purpose.

Example (a notebook cell)::

    demo = labkit.processes.live.Demo(workers=2, ttl=2.0).start()
    demo.pause("A", 5)      # A really stops: /proc says state T
    demo.watch(10)          # the timeline redraws while B takes over
    demo.stop()
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace

from labkit.errors import BadArgument
from labkit.sim.history import check
from labkit.processes.workers import WORKING
from labkit.processes.team import Team, proc_state
from labkit.errors import check_number

__all__ = ["Team", "Demo", "run_demo", "draw", "png", "proc_state"]


class Demo(Team):
    """A team for the lecture hall: timed pauses and a timeline that redraws while it runs.

    Work, hold and rest times scale with ``ttl`` so that the story is visible
    at human speed: a worker works about half a lease after each read.

    Example:
        >>> demo = Demo(workers=2, ttl=2.0, protected=True).start()   # doctest: +SKIP
        >>> demo.pause("A", 5); demo.watch(8); demo.stop()             # doctest: +SKIP
    """

    def __init__(
        self,
        workers: int = 2,
        ttl: float = 2.0,
        protected: bool = True,
        path: str | None = None,
        *,
        seed: int = 0,
        invoices: int = 3,
        root: str | None = None,
    ) -> None:
        super().__init__(
            workers,
            path=path,
            protected=protected,
            seed=seed,
            ttl=ttl,
            root=root,
            work=(0.4 * ttl, 0.6 * ttl),
            hold=(0.03 * ttl, 0.06 * ttl),
            rest=(0.3 * ttl, 0.6 * ttl),
            invoices=invoices,
            busy_timeout_ms=max(200, int(250 * ttl)),
        )
        self._timers: list[threading.Timer] = []
        self.story: dict = {}

    def pause(self, worker: str, seconds: float) -> int | None:
        """Freeze ``worker`` now (SIGSTOP) and thaw it (SIGCONT) after ``seconds``; return its phase.

        Raises:
            BadArgument: for an unknown worker or a negative, NaN or infinite ``seconds``.
        """
        seconds = check_number(seconds, "seconds")
        phase = self.freeze(worker)
        if phase is not None:
            timer = threading.Timer(seconds, self.thaw, (worker,))
            timer.daemon = True
            timer.start()
            self._timers.append(timer)
        return phase

    def resume(self, worker: str) -> bool | None:
        """Thaw ``worker`` now (see :meth:`Team.thaw`)."""
        return self.thaw(worker)

    def stop(self) -> None:
        """Cancel pending thaws, then stop every process (see :meth:`Team.stop`)."""
        for timer in self._timers:
            timer.cancel()
        super().stop()

    def draw(self, ax=None):
        """Draw the timeline so far (see :func:`draw`); return the axes."""
        params = {"protected": self.protected, "ttl": self.options["ttl"], "seed": self.seed}
        return draw(
            self.history(), ax, now=self.now(), title=self.story.get("caption"), params=params
        )

    def watch(self, seconds: float, every: float = 0.3, show: bool = True) -> None:
        """Redraw the timeline every ``every`` seconds for ``seconds`` (in a notebook)."""
        screen, end = _Screen(show), time.monotonic() + seconds
        while time.monotonic() < end:
            screen.update(self)
            time.sleep(every)
        screen.update(self)


def png(ax, dpi: int = 90, path: str | None = None) -> bytes:
    """Render the figure of ``ax`` to PNG bytes (and to ``path`` if given), then close it."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    ax.figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(ax.figure)
    if path is not None:
        with open(path, "wb") as f:
            f.write(buffer.getvalue())
    return buffer.getvalue()


class _Screen:
    """One image in the notebook, replaced on every update (nothing outside IPython)."""

    def __init__(self, show: bool) -> None:
        self.handle, self.show = None, show and "IPython" in sys.modules
        if self.show:
            from IPython import get_ipython

            self.show = get_ipython() is not None

    def update(self, demo: Demo) -> None:
        if not self.show:
            return
        from IPython.display import Image, display

        image = Image(data=png(demo.draw(), dpi=80))
        if self.handle is None:
            self.handle = display(image, display_id=True)
        else:
            self.handle.update(image)


def _story(demo: Demo):
    """A holds the lease and is frozen mid-work; B takes over and commits; A resumes and writes."""
    demo.start("A")
    while (held := demo.holder()) is None or held[0] != "A":
        yield
    demo.start("B")
    while True:
        while demo.phase("A") != WORKING:
            yield
        if demo.freeze("A") == WORKING and demo._frozen.get("A"):
            break
        demo.thaw("A")
        yield
    generation = demo._frozen["A"][0]
    demo.story.update(
        frozen="A",
        generation=generation,
        caption=f"A frozen with generation {generation}; waiting for B",
    )
    while not any(
        e.worker == "B" and e.action == "write" and e.outcome == "ok" and e.generation > generation
        for e in demo.history()
    ):
        yield
    beat = demo.now() + demo.options["ttl"] / 2
    while demo.now() < beat:
        yield
    demo.thaw("A")
    while not (
        seen := [
            e
            for e in demo.history()
            if e.worker == "A"
            and e.action == "write"
            and e.generation == generation
            and e.outcome in ("ok", "rejected")
        ]
    ):
        yield
    demo.story["outcome"] = seen[0].outcome
    demo.story["caption"] = f"A's stale write (generation {generation}) " + (
        "bounced off the fence" if seen[0].outcome == "rejected" else "landed"
    )


def run_demo(
    seconds: float | None = None,
    *,
    protected: bool = True,
    ttl: float | None = None,
    path: str | None = None,
    show: bool = True,
    every: float = 0.3,
    root: str | None = None,
) -> Demo:
    """Play the story with two real processes and a live timeline, then stop them all.

    A acquires the lease and starts working; A is frozen (SIGSTOP) past its
    lease; B takes over and commits; A is resumed and its stale write is
    rejected by the fence (``protected=True``) or lands (``protected=False``).
    The demo then keeps running until ``seconds`` have passed.

    Args:
        seconds: how long to run (default: ``$LABKIT_LIVE_SECONDS``, else 20).
        protected: the write path. ttl: the lease (default: seconds / 10, within 0.5 to 2).
        path: the SQLite file (default: a temporary one). show: draw in the notebook.
        every: seconds between redraws. root: where the run's folder goes (see :class:`Team`).

    Returns:
        The stopped :class:`Demo`: ``demo.history()``, ``demo.check()``, ``demo.story``.

    Raises:
        KeyboardInterrupt: after stopping every process, if the cell is interrupted.
    """
    if seconds is None:
        seconds = float(os.environ.get("LABKIT_LIVE_SECONDS", "20"))
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < 3600:
        raise BadArgument("seconds", f"must be a number of seconds in (0, 3600), got {seconds!r}")
    ttl = ttl if ttl is not None else min(2.0, max(0.5, seconds / 10))
    demo, screen = Demo(2, ttl, protected, path, root=root), _Screen(show)
    story, telling = _story(demo), True
    end, last = seconds, -every
    try:
        while telling or demo.now() < end:
            if telling:
                telling = next(story, StopIteration) is not StopIteration
            if demo.now() > end + 20 * ttl:
                break
            if demo.now() - last >= every:
                screen.update(demo)
                last = demo.now()
            time.sleep(0.05)
    finally:
        demo.stop()
    screen.update(demo)
    return demo


@dataclass(frozen=True)
class _Run:
    """What :func:`labkit.views.plot.timeline` draws: a history, its violations, a verdict, the knobs."""

    history: list
    violations: list
    verdict: str
    params: dict


def draw(
    history,
    ax=None,
    *,
    now: float | None = None,
    title: str | None = None,
    params: dict | None = None,
):
    """Draw a run of real processes with :func:`labkit.views.plot.timeline`; return the axes.

    The history is adapted first: a freeze is drawn from its ``pause`` to the
    worker's ``resume`` or ``crash`` (or ``now`` while it lasts), and a write or
    lease call refused with "database is locked" is drawn as waiting for the lock.

    Args:
        history: events (e.g. ``team.history()``). ax: axes to draw into (default: a new figure).
        now: the time of the drawing, for freezes still going on.
        title: the title (default: the violations found, or "no violation").
        params: knobs for the caption, e.g. ``{"protected": True, "ttl": 2.0}``.
    """
    from labkit.views.plot import timeline

    events = sorted((e for e in history if e.worker), key=lambda e: e.time)
    end = now if now is not None else max([e.time for e in events] + [0.0])
    drawn = []
    for i, e in enumerate(events):
        if e.action == "pause":
            thawed = next(
                (
                    f.time
                    for f in events[i + 1 :]
                    if f.worker == e.worker and f.action in ("resume", "crash")
                ),
                end,
            )
            e = replace(e, until=thawed)
        elif e.outcome == "busy":
            e = replace(e, action="wait")
        drawn.append(e)
    violations = check(history)
    kinds = Counter(v.kind for v in violations)
    verdict = title or ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "no violation"
    ax = timeline(_Run(drawn, violations, verdict, dict(params or {})), ax)
    ax.set_xlabel("seconds (real time)")
    return ax
