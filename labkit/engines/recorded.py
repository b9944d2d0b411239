"""Recorded runs of the real engines, kept as data: what each ▶ engine button of lessons 02 and 04
played once on a real server, so that a notebook without PostgreSQL, Redis or etcd still draws it.

A recording is one button's runs, in ``recordings/NAME.json``: the ``engine``, the ``version``
its server reported, the ``date`` it was taken, the ``button``'s label, and for each run the
timeline's ``params``, the story's ``text`` as it was printed and its ``steps``. A step is an
object of the :class:`~labkit.engines.servers.Step`'s fields that are not None, a token
``(epoch, counter)`` a two-item list; a text is the list of its lines (split at ``\n``). :func:`loads` and :func:`dumps` turn the one into the
other, exactly. :func:`outline` is what two runs of one story share whatever their timings.

``python -m labkit.engines.recorded [NAME ...]`` plays the buttons' runs on this machine's
servers and writes their recordings (all of them without a NAME). Real time is read there, and
today's date, on purpose.
"""

from __future__ import annotations

import datetime
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from labkit.engines.servers import Step
from labkit.errors import BadArgument

__all__ = ["NAMES", "Recorded", "Recording", "dumps", "load", "loads", "outline", "play"]

FOLDER = Path(__file__).resolve().parent / "recordings"
#: each recording's name: (its engine, the lesson, the label of the button whose runs it keeps)
NAMES = {
    "postgres-rowlock": ("PostgreSQL", "02", "▶ run on a real PostgreSQL"),
    "redis-failover": ("Redis", "04", "▶ run on a real Redis"),
    "etcd-leader-kill": ("etcd", "04", "▶ run on a real etcd cluster"),
    "etcd-restore": ("etcd", "04", "▶ restore a real etcd from a snapshot"),
}
_HEAD = ("engine", "version", "date", "button")  # a recording's fields above its runs
MARKS = ("✓", "✗")  # how a story's text judges what it saw, a line each


@dataclass(frozen=True, slots=True)
class Recorded:
    """One run of a recording: the timeline's ``params`` (its caption, as the button gives
    them), the story's ``text`` as the button printed it, and its ``steps``."""

    params: dict
    text: str
    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Recording:
    """What one ▶ button played on a real server: its ``name`` (see :data:`NAMES`), the
    ``engine``, the ``version`` its server reported, the ``date`` (ISO) of the run, the
    ``button``'s label, and its ``runs``."""

    name: str
    engine: str
    version: str
    date: str
    button: str
    runs: tuple[Recorded, ...]

    @property
    def label(self) -> str:
        """What the lesson prints above the pictures: where and when this was recorded."""
        return f"recorded on {self.engine} {self.version}, {self.date}"


def _token(value):
    return tuple(value) if isinstance(value, list) else value


def _step(data: dict) -> Step:
    unknown = set(data) - set(Step._fields)
    if unknown or not {"time", "worker", "action", "outcome"} <= set(data):
        raise BadArgument("text", f"a step has fields {sorted(data)}, not a Step's")
    return Step(**{k: _token(v) if k == "generation" else v for k, v in data.items()})


def loads(text: str, name: str) -> Recording:
    """The recording ``name`` from its file's ``text``; raises BadArgument if it is not one."""
    try:
        data = json.loads(text)
        runs = tuple(
            Recorded(run["params"], "\n".join(run["text"]), tuple(map(_step, run["steps"])))
            for run in data.pop("runs")
        )
        return Recording(name=name, runs=runs, **data)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadArgument("text", f"not a recording of {name!r}: {exc}") from None


def dumps(recording: Recording) -> str:
    """``recording`` as the text of its file (its ``name`` is the file's): JSON, with the text
    of each run as a list of its lines and a line per step."""
    line = lambda value: json.dumps(value, ensure_ascii=False)
    head = "".join(f"\n {line(k)}: {line(getattr(recording, k))}," for k in _HEAD)
    runs = [
        f'\n  {{"params": {line(run.params)},\n   "text": [\n    '
        + ",\n    ".join(map(line, run.text.split("\n")))
        + '],\n   "steps": [\n    '
        + ",\n    ".join(line(_fields(step)) for step in run.steps)
        + "]}"
        for run in recording.runs
    ]
    return "{" + head + '\n "runs": [' + ",".join(runs) + "]}\n"


def _fields(step: Step) -> dict:
    return {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in step._asdict().items()
        if v is not None
    }


def load(name: str) -> Recording:
    """The stored recording ``name`` (one of :data:`NAMES`)."""
    if name not in NAMES:
        raise BadArgument("name", f"no recording {name!r}; there are {', '.join(NAMES)}")
    return loads((FOLDER / f"{name}.json").read_text(encoding="utf-8"), name)


def outline(run: Recorded) -> dict:
    """What a run of a story keeps from one time to the next, whatever its timings: ``kinds``,
    each step's ``(worker, action, outcome, target)`` in the run's order; ``tokens``, each step's
    token as its rank among the run's distinct tokens (None without one; a counter a resource
    stored ranks among counters, an ``(epoch, counter)`` among those), so that "B is given
    A's token again" or "every token is above all before it" shows; and ``marks``, the ✓ and ✗
    with which the story's text judged what it saw, in order."""
    tokens = {s.generation for s in run.steps if s.generation is not None}
    tokens = sorted(tokens, key=lambda token: (isinstance(token, tuple), token))
    return {
        "kinds": [(s.worker, s.action, s.outcome, s.target) for s in run.steps],
        "tokens": [None if s.generation is None else tokens.index(s.generation) for s in run.steps],
        "marks": [line[0] for line in run.text.splitlines() if line[:1] in MARKS],
    }


def _runs(name: str) -> tuple[str, list]:
    """Play the runs of the button of ``name`` as its lesson does: (the version, [(params,
    story)]). Each starts its own throwaway servers and stops them before it returns."""
    from labkit.engines import etcd, redis, rowlock

    if name == "postgres-rowlock":
        plays = [({"engine": "PostgreSQL", "seed": "-"}, rowlock.run)]
    elif name == "redis-failover":
        plays = [
            ({"protected": p, "engine": "Redis", "seed": "-"}, lambda p=p: redis.story(p))
            for p in (False, True)
        ]
    else:
        story = etcd.story if name == "etcd-leader-kill" else etcd.restore_story
        plays = [({"protected": True, "engine": "etcd", "seed": "-"}, story)]
    played = [(params, run()) for params, run in plays]
    versions = {story.version for _, story in played}
    if len(versions) != 1:
        raise BadArgument("name", f"the runs of {name!r} were on different versions: {versions}")
    return versions.pop(), played


def play(name: str, date: str | None = None) -> Recording:
    """Play the runs of the button of ``name`` on this machine's servers now, recorded on
    ``date`` (default: today). Times are rounded to 0.1 ms."""
    if name not in NAMES:
        raise BadArgument("name", f"no recording {name!r}; there are {', '.join(NAMES)}")
    version, played = _runs(name)
    runs = tuple(
        Recorded(params, story.text, tuple(_rounded(s) for s in story.steps))
        for params, story in played
    )
    engine, _, button = NAMES[name]
    date = date or datetime.date.today().isoformat()
    return Recording(name, engine, version.split()[0], date, button, runs)


def _rounded(step: Step) -> Step:
    return step._replace(
        **{
            k: round(getattr(step, k), 4)
            for k in ("time", "until", "began")
            if getattr(step, k) is not None
        }
    )


def main(argv: list[str]) -> int:
    """Record the named buttons' runs (all without names) and write their files."""
    for name in argv or NAMES:
        recording = play(name)
        (FOLDER / f"{name}.json").write_text(dumps(recording), encoding="utf-8")
        print(f"{name}: {recording.label}, {len(recording.runs)} run(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
