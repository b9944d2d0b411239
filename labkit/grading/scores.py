"""Points per property: what one task's trials found, and what it is worth.

A task declares named properties (``"stale refused": "a write with a stale generation is
refused and writes nothing"``). Its trials run every schedule; each :func:`~labkit.grading.expect`
is one piece of evidence for one property. A property scores its points only when some schedule
checked it and it held, and no schedule broke it. An answer that cannot be run at all (not
written, crashed, silent, refused by the sandbox) scores nothing: its :attr:`Report.problem`
says why. A :class:`Report` travels as JSON from the judge to the check cell and the grader.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Failure", "Finding", "Report", "weights", "shown_points"]

#: the points of a task when the grader is not told otherwise (shared among its properties)
TASK_POINTS = 10.0


@dataclass(frozen=True, slots=True)
class Failure:
    """Where a property broke: the rule the trial checked, what it saw, the schedule, and the
    events the trial logged in it up to the break (as dicts: they travel as JSON)."""

    rule: str
    detail: str
    schedule: str
    seed: int | None = None
    knobs: dict | None = None
    events: tuple = ()
    run: int | None = None  # the grading run's seed (see :class:`~labkit.grading.lab.Schedule`)

    def __post_init__(self) -> None:  # JSON has no tuples: a token (epoch, n) comes back one
        events = tuple(
            {**e, "generation": _token(e["generation"])} if "generation" in e else e
            for e in self.events
        )
        object.__setattr__(self, "events", events)

    def lines(self, task: str, answer: str) -> list[str]:
        out = [f"rule: {self.rule}"] if self.rule else []
        out += [f"observed: {self.detail}"] if self.detail else []
        if self.seed is not None:
            run = "" if self.run is None else f", run {self.run}"
            out.append(f"schedule: {self.schedule} (seed {self.seed}{run}, knobs {self.knobs})")
            out.append(f"replay it: {self.replay(task, answer)}")
        return out

    def replay(self, task: str, answer: str) -> str:
        run = "" if self.run is None else f", run={self.run}"
        return f"labkit.grading.replay({task!r}, {answer}, seed={self.seed}{run})"


@dataclass(frozen=True, slots=True)
class Finding:
    """One property of one task: ``held`` schedules checked it and it held; ``broken`` is the
    first schedule that broke it (None: none did)."""

    prop: str
    words: str
    held: int = 0
    broken: Failure | None = None

    @property
    def scored(self) -> bool:
        return self.held > 0 and self.broken is None


def _token(value):
    """An event's generation with its declared type: an int, None, or an (epoch, n) tuple."""
    return tuple(map(_token, value)) if isinstance(value, (list, tuple)) else value


def weights(props, given=None) -> dict[str, float]:
    """Points per property: ``given`` (a number for the task, shared equally, or a dict of
    points per property name), by default :data:`TASK_POINTS` shared equally."""
    names = list(props)
    if isinstance(given, dict):
        return {p: float(given.get(p, 0.0)) for p in names}
    total = TASK_POINTS if given is None else float(given)
    return {p: total / len(names) for p in names}


def shown_points(x: float) -> str:
    """Points in words: ``2.5``, ``3.33``, ``10``, ``1234567``."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


@dataclass(frozen=True, slots=True)
class Report:
    """What the judge found for one task: a finding per declared property, in order, and
    ``problem`` (a Finding whose failure says why) when the answer could not be run."""

    task: str
    title: str
    answer: str
    findings: tuple[Finding, ...] = ()
    problem: Finding | None = None
    run: int | None = None  # the grading run's seed: the same seed grades the same again

    @property
    def passed(self) -> bool:
        return self.problem is None and all(f.scored for f in self.findings)

    @property
    def seed(self) -> int | None:
        """The seed of the first failure (the problem's, else the first broken property's)."""
        first = [f.broken for f in (self.problem, *self.findings) if f and f.broken]
        return next((b.seed for b in first if b.seed is not None), None)

    def points(self, given=None) -> dict[str, tuple[float, float]]:
        """``{property: (points scored, points possible)}``."""
        worth = weights([f.prop for f in self.findings], given) if self.findings else {}
        ok = self.problem is None
        return {
            f.prop: (worth[f.prop] if ok and f.scored else 0.0, worth[f.prop])
            for f in self.findings
        }

    def total(self, given=None) -> tuple[float, float]:
        pts = self.points(given).values()
        return sum(p for p, _ in pts), sum(w for _, w in pts)

    def failed(self) -> list[Finding]:
        """The problem, or the properties that did not score (broken, or never checked)."""
        if self.problem is not None:
            return [self.problem]
        return [f for f in self.findings if not f.scored]

    def text(self, given=None) -> str:
        """The scorecard of this task in words: the check cell, the notes and the feedback."""
        got, possible = map(shown_points, self.total(given))
        if self.passed:
            head = f"PASS {self.task}: {self.title} held under every schedule ({got}/{possible} points)"
        else:
            head = f"task {self.task}: {got}/{possible} points ({self.title})"
        lines = [head]
        if self.problem is not None:
            lines.append(f"  no points until {self.problem.words}")
            lines += [f"    {line}" for line in self.problem.broken.lines(self.task, self.answer)]
        points = self.points(given)
        for f in self.findings:
            scored, worth = points[f.prop]
            mark = "BROKEN" if f.broken else "held" if f.scored else "never checked"
            mark = mark if self.problem is None or f.broken else "not scored"
            pts = f"{shown_points(scored)}/{shown_points(worth)}"
            lines.append(f"  {pts}  {mark} [{f.prop}]: {f.words}")
            if f.broken and self.problem is None:
                lines += [f"      {line}" for line in f.broken.lines(self.task, self.answer)]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Report:
        def finding(d):
            if d is None:
                return None
            broken = d.get("broken")
            if broken:
                broken = Failure(**{**broken, "events": tuple(broken.get("events", ()))})
            return Finding(d["prop"], d["words"], d["held"], broken or None)

        return cls(
            data["task"],
            data["title"],
            data["answer"],
            tuple(map(finding, data["findings"])),
            finding(data["problem"]),
            data.get("run"),
        )


def unrun(task: str, why: str, *, title: str = "", answer: str = "answer", props=()) -> Report:
    """The report of a task whose answer never ran (``why``), its properties unscored."""
    problem = Finding("runs", "the answer runs", 0, Failure("", why, ""))
    found = tuple(Finding(p, w) for p, w in dict(props).items())
    return Report(task, title or task, answer, found, problem)
