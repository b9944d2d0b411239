"""Live: real worker processes on one SQLite file, in real time, in front of an audience.

:func:`run_demo` plays the story in one cell: A is frozen (SIGSTOP) holding the lease,
B takes over and commits, A is thawed and its stale write bounces off the fence or lands.
:class:`Demo` is a :class:`~labkit.processes.team.Team` paced for human eyes, with a
timeline that redraws while it runs. Every process is stopped when the demo ends, when
the cell is interrupted and at interpreter exit. Real time is read here on purpose.

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
from dataclasses import replace
from types import SimpleNamespace

from labkit.errors import check_number
from labkit.processes.team import Team, proc_state
from labkit.sim import check

__all__ = ["Demo", "Team", "draw", "png", "proc_state", "run_demo"]


class Demo(Team):
    """A team for the lecture hall: work, hold and rest times scale with ``ttl`` so that the
    story is visible at human speed (a worker works about half a lease after each read)."""

    def __init__(self, workers=2, ttl=2.0, protected=True, path=None, *, seed=0, root=None):
        ttl = check_number(ttl, "ttl", positive=True)
        times = dict(work=(0.4 * ttl, 0.6 * ttl), hold=(0.03 * ttl, 0.06 * ttl))
        times.update(rest=(0.3 * ttl, 0.6 * ttl), busy_timeout_ms=max(200, int(250 * ttl)))
        super().__init__(
            workers, path=path, protected=protected, seed=seed, root=root, ttl=ttl, **times
        )
        self.story: dict = {}
        self._timers: list[threading.Timer] = []

    def pause(self, worker: str, seconds: float) -> int | None:
        """Freeze ``worker`` now and thaw it after ``seconds``; return its phase (see ``freeze``)."""
        seconds = check_number(seconds, "seconds")
        phase = self.freeze(worker)
        if phase is not None:
            self._timers.append(timer := threading.Timer(seconds, self.thaw, (worker,)))
            timer.daemon = True
            timer.start()
        return phase

    def stop(self) -> None:
        """Cancel pending thaws, then stop every process (see :meth:`Team.stop`)."""
        for timer in self._timers:
            timer.cancel()
        super().stop()

    def resume(self, worker: str) -> bool | None:
        """Thaw ``worker`` now (see :meth:`Team.thaw`)."""
        return self.thaw(worker)

    def draw(self, ax=None):
        """Draw the timeline so far (see :func:`draw`); return the axes."""
        params = {"protected": self.protected, "ttl": self.spec.ttl, "seed": self.seed}
        caption = self.story.get("caption")
        return draw(self.history(), ax, now=self.now(), title=caption, params=params)

    def watch(self, seconds: float, every: float = 0.3, show: bool = True) -> None:
        """Redraw the timeline every ``every`` seconds for ``seconds`` (in a notebook)."""
        screen, end = _Screen(show), self.now() + seconds
        while self.now() < end:
            screen.update(self)
            time.sleep(every)
        screen.update(self)


def run_demo(seconds=None, *, protected=True, ttl=None, path=None, show=True, every=0.3, root=None):
    """Play the story with two real processes and a live timeline, then stop them all.

    A works under the lease and is frozen past it; B takes over and commits; A is thawed
    and its stale write is rejected by the fence (``protected=True``) or lands. The demo
    runs on until ``seconds`` (default ``$LABKIT_LIVE_SECONDS``, else 20) have passed;
    ``ttl`` defaults to seconds / 10, within 0.5 to 2. Returns the stopped :class:`Demo`
    (``demo.history()``, ``demo.check()``, ``demo.story``); an interrupted cell stops
    every process before the KeyboardInterrupt leaves.
    """
    if seconds is None:
        seconds = float(os.environ.get("LABKIT_LIVE_SECONDS", "20"))
    seconds = check_number(seconds, "seconds", positive=True, high=3600)
    ttl = ttl if ttl is not None else min(2.0, max(0.5, seconds / 10))
    demo, screen, shown = Demo(2, ttl, protected, path, root=root), _Screen(show), -every
    story, limit = _story(demo), seconds + 20 * demo.spec.ttl  # a story not done by then ends
    try:
        while (next(story, False) or demo.now() < seconds) and demo.now() < limit:
            if demo.now() - shown >= every:
                screen.update(demo)
                shown = demo.now()
            time.sleep(0.05)
    finally:
        demo.stop()
    screen.update(demo)
    return demo


def _story(demo: Demo):
    """The story, one step per ``next``: A leases, is frozen at work, B commits, A writes."""
    demo.start("A")
    while not (held := demo.holder()) or held[0] != "A":
        yield True
    demo.start("B")
    while (caught := demo.freeze_holder("A")) is None:
        yield True
    generation = caught[1]
    caption = f"A frozen with generation {generation}; waiting for B"
    demo.story.update(frozen="A", generation=generation, caption=caption)
    while not demo.overtaken(generation):
        yield True
    beat = demo.now() + demo.spec.ttl / 2
    while demo.now() < beat:
        yield True
    demo.thaw("A")
    while not (stale := [e for e in demo.history() if _answers(e, generation)]):
        yield True
    landed = "landed" if stale[0].outcome == "ok" else "bounced off the fence"
    demo.story.update(
        outcome=stale[0].outcome, caption=f"A's stale write (generation {generation}) {landed}"
    )


def _answers(e, generation) -> bool:
    """True for A's answered write with ``generation``."""
    answered = e.action == "write" and e.outcome in ("ok", "rejected")
    return answered and (e.worker, e.generation) == ("A", generation)


class _Screen:
    """One image in the notebook, replaced on every update (nothing outside IPython)."""

    def __init__(self, show: bool) -> None:
        self.handle, self.show = None, show and "IPython" in sys.modules
        if self.show:
            from IPython import get_ipython

            self.show = get_ipython() is not None

    def update(self, demo: Demo) -> None:
        if self.show:
            from IPython.display import Image, display

            image = Image(data=png(demo.draw(), dpi=80))
            if self.handle is None:
                self.handle = display(image, display_id=True)
            else:
                self.handle.update(image)


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


def draw(history, ax=None, *, now=None, title=None, params=None):
    """Draw a run of real processes with :func:`labkit.views.plot.timeline`; return the axes.

    A freeze is drawn from its ``pause`` to the worker's ``resume`` or ``crash`` (or to
    ``now`` while it lasts), and a call refused with "database is locked" as a wait for the
    lock. The title defaults to the violations found; ``params`` go to the caption.
    """
    from labkit.views.plot import timeline

    events = sorted((e for e in history if e.worker), key=lambda e: e.time)
    end = now if now is not None else max([e.time for e in events], default=0.0)
    drawn = []
    for i, e in enumerate(events):
        if e.action == "pause":
            ends = (
                f.time
                for f in events[i + 1 :]
                if f.worker == e.worker and f.action in ("resume", "crash")
            )
            e = replace(e, until=next(ends, end))
        elif e.outcome == "busy":
            e = replace(e, action="wait")
        drawn.append(e)
    violations = check(history)
    kinds = Counter(v.kind for v in violations)
    verdict = title or ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "no violation"
    run = SimpleNamespace(
        history=drawn, violations=violations, verdict=verdict, params=dict(params or {})
    )
    ax = timeline(run, ax)
    ax.set_xlabel("seconds (real time)")
    return ax
