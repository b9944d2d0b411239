"""Live: real worker processes on one SQLite file, in real time, in front of an audience.

:func:`run_demo` plays the story in one cell: A is frozen holding the lease, B takes over and
commits, A is thawed and its stale write bounces off the fence or lands. :func:`watch_room`
shows a classroom's students (:mod:`labkit.engines.classroom`) from the server's event log."""

import io
import os
import threading
import time
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

from labkit.errors import check_number
from labkit.processes.team import Team, proc_state
from labkit.sim import Event, check, warnings

__all__ = ["Demo", "Team", "draw", "png", "proc_state", "run_demo", "run_of", "show_steps"]
__all__ += ["draw_room", "room_history", "watch_room"]


REAL_TIME = "seconds (real time)"  # the time axis of a run of real processes


class Demo(Team):
    """A team for the lecture hall: work, hold and rest times scale with ``ttl`` so that the
    story is visible at human speed (a worker works about half a lease after each read)."""

    def __init__(self, workers=2, ttl=2.0, protected=True, *, root=None):
        ttl = check_number(ttl, "ttl", positive=True)
        times = dict(work=(0.4 * ttl, 0.6 * ttl), hold=(0.03 * ttl, 0.06 * ttl))
        times.update(rest=(0.3 * ttl, 0.6 * ttl), busy_timeout_ms=max(200, int(250 * ttl)))
        super().__init__(workers, protected=protected, root=root, ttl=ttl, **times)
        self.story: dict = {}

    def pause(self, worker: str, seconds: float) -> int | None:
        """Freeze ``worker`` now, thaw it after ``seconds``; return its phase (see ``freeze``)."""
        seconds = check_number(seconds, "seconds")
        phase = self.freeze(worker)
        if phase is not None:
            timer = threading.Timer(seconds, self.thaw, (worker,))
            timer.daemon = True  # after stop, a thaw finds nothing frozen and does nothing
            timer.start()
        return phase

    def resume(self, worker: str) -> bool | None:
        """Thaw ``worker`` now (see :meth:`Team.thaw`)."""
        return self.thaw(worker)

    def draw(self, ax=None):
        """Draw the timeline so far (see :func:`draw`); return the axes."""
        return draw(self.history(), ax, now=self.now(), **self._knobs())

    def current(self) -> SimpleNamespace:
        """The run so far, as the timeline takes it (see :func:`run_of`)."""
        return run_of(self.history(), now=self.now(), **self._knobs())

    def _knobs(self) -> dict:
        params = {"protected": self.spec.protected, "ttl": self.spec.ttl, "seed": self.seed}
        return {"params": params, "title": self.story.get("caption")}

    @property
    def text(self) -> str:
        """The story so far in words: who was frozen with which generation, and how A's stale
        write ended."""
        if "frozen" not in self.story:
            return "the story did not get as far as freezing A"
        ended = {"ok": "✗ it landed", "rejected": "✓ the fence refused it"}
        outcome = ended.get(self.story.get("outcome"), "it was not answered in time")
        return (
            f"{self.story['frozen']} was frozen holding the lease with generation "
            f"{self.story['generation']}; B took over and committed; then A's stale write "
            f"(generation {self.story['generation']}): {outcome}"
        )


def run_demo(seconds=None, *, protected=True, show=True, root=None):
    """Play the story with two real processes and a live timeline, then stop them all.
    It runs ``seconds`` (default ``$LABKIT_LIVE_SECONDS``, else 20) with leases of a tenth of
    that (0.5 to 2 s) and returns the stopped :class:`Demo` (``history()``, ``check()``,
    ``story``). An interrupted cell stops every process before the KeyboardInterrupt leaves."""
    seconds = float(os.environ.get("LABKIT_LIVE_SECONDS", "20")) if seconds is None else seconds
    seconds = check_number(seconds, "seconds", positive=True, high=3600)
    demo = Demo(2, min(2.0, max(0.5, seconds / 10)), protected, root=root)
    story, limit = _story(demo), seconds + 20 * demo.spec.ttl  # a story not done by then ends
    try:
        redraw, shown = _screen(demo, show), 0.0
        while (next(story, False) or demo.now() < seconds) and demo.now() < limit:
            if demo.now() - shown >= 0.3:  # redraw about three times a second
                redraw()
                shown = demo.now()
            time.sleep(0.05)
    finally:
        demo.stop()
    redraw()
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
    answers = ("A", "write", generation, True)
    while not (stale := [e for e in demo.history() if _key(e) == answers]):
        yield True
    landed = "landed" if stale[0].outcome == "ok" else "bounced off the fence"
    caption = f"A's stale write (generation {generation}) {landed}"
    demo.story.update(outcome=stale[0].outcome, caption=caption)


def _key(e) -> tuple:
    """Who wrote, with which generation, and whether it was answered (committed or refused)."""
    return e.worker, e.action, e.generation, e.outcome in ("ok", "rejected")


def _screen(demo: Demo, show: bool):
    """Show ``demo``'s timeline (in a notebook); return ``redraw()``, which redraws it in place
    (on a :class:`~labkit.views.screen.Screen`: a button's output keeps its updates too)."""
    if not show:
        return lambda: None
    from labkit.views.screen import show as show_run

    screen = show_run(demo.current())
    return lambda: screen.draw(demo.current())


def png(ax) -> bytes:
    """Render the figure of ``ax`` to PNG bytes, then close it."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    ax.figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    plt.close(ax.figure)
    return buffer.getvalue()


def draw(history, ax=None, *, params, now=None, title=None, lanes=14):
    """Draw a run of real processes (see :func:`run_of`) with :func:`labkit.views.plot.timeline`,
    ``lanes`` at most; return the axes."""
    from labkit.views.plot import timeline

    ax = timeline(run_of(history, params=params, now=now, title=title), ax, lanes=lanes)
    ax.set_xlabel(REAL_TIME)
    return ax


def show_steps(history, *, params, title=None):
    """Display a run of real processes on a :class:`~labkit.views.screen.Screen` (its picture
    drawn where a button's callback shows it, too); return the screen."""
    from labkit.views.screen import show as show_run

    return show_run(run_of(history, params=params, title=title))


def run_of(history, *, params, now=None, title=None) -> SimpleNamespace:
    """A run of real processes as the timeline takes it: ``params`` in the caption; a freeze
    lasts from its ``pause`` to the next ``resume`` or ``crash`` (or ``now``), a Busy call is a
    wait; the verdict is ``title`` or else the checker's."""
    events = sorted((e for e in history if e.worker), key=lambda e: e.time)
    end = now if now is not None else max([e.time for e in events], default=0.0)
    drawn, ends = [], {}  # walking back in time: each worker's next resume or crash
    for e in reversed(events):
        if e.action in ("resume", "crash"):
            ends[e.worker] = e.time
        elif e.action == "pause":
            e = replace(e, until=ends.get(e.worker, end))
        elif e.outcome == "busy":
            e = replace(e, action="wait")
        drawn.append(e)
    found, warned = check(history), warnings(history)
    kinds = Counter(v.kind for v in found)
    verdict = title or ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "no violation"
    run = SimpleNamespace(history=drawn[::-1], violations=found, verdict=verdict, params=params)
    run.warnings, run.xlabel = warned, REAL_TIME
    return run


def room_history(rows) -> list[Event]:
    """``Room.events()`` rows as Events (seconds from the first); a pause ends, a grant raises."""
    t0, fence, events = (rows[0][1] if rows else 0.0), 0, []
    for _, at, began, who, action, outcome, gen, until in rows:
        at, began, until = (None if t is None else t - t0 for t in (at, began, until))
        events.append(Event(at, who, action, outcome, gen, until=until, began=began))
        if action == "pause":
            events.append(Event(until, who, "resume", "ok", gen))
        elif action == "acquire" and outcome == "ok":
            events.append(Event(at, who, "raise", "ok", fence := max(fence, gen)))
    return [e for e in events if e.action != "join"]


def draw_room(room, ax=None, *, protected=None, lanes=40):
    """Draw a classroom so far: a lane per student (at least ``lanes`` before any is pooled)."""
    events = room_history(room.events())
    students = len({e.worker for e in events})
    params = {"protected": protected, "students": students, "seed": "-"}
    return draw(events, ax, params=params, lanes=max(lanes, students, 2))


def watch_room(room, seconds=60.0, *, every=1.0, protected=None):
    """Show :func:`draw_room` in a notebook, redrawn every ``every`` seconds for ``seconds``."""
    redraw = _screen(SimpleNamespace(draw=lambda: draw_room(room, protected=protected)), True)
    for _ in range(int(seconds / every)):
        time.sleep(every)
        redraw()
