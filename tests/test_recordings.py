"""The real engines' recorded runs: each ▶ engine button's runs, taken once on a real server and
kept as data (``labkit/engines/recordings/``), drawn under the button by lessons 02 and 04.

A recording loads into the Steps it was made of and writes back byte for byte; it draws a
picture with its label (engine, version, date) above it, with no server at all. Where the engines
are installed (skipped loudly without them; failed under ``LABKIT_REQUIRE_POSTGRES=1`` or
``LABKIT_REQUIRE_ENGINES=1``), a fresh real run of each button must still tell the recording's
story: the same checker's verdict, the same ✓ and ✗ of the story's text, the same kinds of steps
in the same order, and the same pattern of tokens. Only the timings (and pids) may differ.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import matplotlib
import pytest
from direct_buttons import ink
from engines import require_postgres
from hypothesis import given
from hypothesis import strategies as st
from prerequisites import require
from test_etcd import missing as etcd_missing
from test_redis import missing_prerequisite as redis_missing

from labkit.engines import recorded, servers
from labkit.engines.servers import Step
from labkit.errors import BadArgument
from labkit.processes.live import REAL_TIME, run_of
from labkit.sim import Event
from labkit.views.render import TimelineRenderer
from labkit.views.screen import Screen

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parents[1]
#: what each recording was taken on (a new recording on other versions changes this table)
TAKEN_ON = {
    "postgres-rowlock": ("PostgreSQL", "15.", "2026-12-04"),
    "redis-failover": ("Redis", "7.0.", "2026-12-04"),
    "etcd-leader-kill": ("etcd", "3.4.", "2026-12-04"),
    "etcd-restore": ("etcd", "3.4.", "2026-12-04"),
}
LESSONS = {"02": ROOT / "notebooks/02-fencing-tokens.ipynb"}
LESSONS["04"] = ROOT / "notebooks/04-who-issues-the-numbers.ipynb"
MARKS = 1500  # pixels of marks a picture has beyond its empty frame, at least


def story(run: recorded.Recorded) -> dict:
    """What a run's story is, whatever its timings: the checker's verdict as the picture shows
    it, and the run's :func:`~labkit.engines.recorded.outline` (kinds, tokens, marks)."""
    drawn = run_of([Event(*step) for step in run.steps], params=run.params)
    return {"verdict": drawn.verdict, "params": run.params, **recorded.outline(run)}


def differences(fresh: recorded.Recording, kept: recorded.Recording) -> list[str]:
    """Where ``fresh``'s story departs from ``kept``'s: one line per run and part that differs,
    naming the first differing step of a list; empty if they tell the same story."""
    if len(fresh.runs) != len(kept.runs):
        return [f"{len(fresh.runs)} runs, recorded {len(kept.runs)}"]
    found = []
    for i, (a, b) in enumerate(zip(map(story, fresh.runs), map(story, kept.runs))):
        for part in a:
            if a[part] != b[part]:
                at = next((j for j, (x, y) in enumerate(zip(a[part], b[part])) if x != y), None)
                where = "" if at is None or isinstance(a[part], str) else f" at step {at}"
                found.append(f"run {i}: {part} differ{where}: {a[part]!r:.300} != {b[part]!r:.300}")
    return found


def frame_ink(run) -> int:
    """The ink of ``run``'s frame alone: its lanes, axes and legend, with no step drawn."""
    renderer = TimelineRenderer([run], xlabel=REAL_TIME)
    return ink(renderer.png(run_of([], params=run.params)))


# -- the recordings as data


@pytest.mark.parametrize("name", recorded.NAMES)
def test_a_recording_file_loads_and_writes_back_byte_for_byte(name):
    """JSON -> Steps -> JSON is exact, and so is Steps -> JSON -> Steps (a token (epoch,
    counter) comes back a tuple, as the run made it, never a list)."""
    text = (recorded.FOLDER / f"{name}.json").read_text(encoding="utf-8")
    recording = recorded.loads(text, name)
    assert recorded.dumps(recording) == text
    assert recorded.loads(recorded.dumps(recording), name) == recording
    steps = [step for run in recording.runs for step in run.steps]
    assert steps and all(type(step) is Step for step in steps)
    assert not any(isinstance(step.generation, list) for step in steps)


steps = st.builds(
    Step,
    time=st.floats(0, 1e4),
    worker=st.text(min_size=1, max_size=5),
    action=st.sampled_from(["acquire", "write", "raise", "pause", "crash"]),
    outcome=st.text(max_size=12),
    generation=st.none() | st.integers(-(2**53), 2**53) | st.tuples(st.integers(0, 9), st.integers()),
    key=st.none() | st.text(max_size=8),
    target=st.none() | st.text(max_size=20),
    until=st.none() | st.floats(0, 1e4),
    began=st.none() | st.floats(0, 1e4),
)
runs = st.builds(
    recorded.Recorded,
    params=st.dictionaries(st.text(max_size=8), st.booleans() | st.text(max_size=8), max_size=3),
    text=st.text(),
    steps=st.lists(steps, max_size=6).map(tuple),
)


@given(st.lists(runs, min_size=1, max_size=3))
def test_any_recording_of_steps_survives_its_file_exactly(made):
    """Whatever the steps hold (floats, None fields, int or (epoch, counter) tokens, any text),
    a recording written and read back is equal to it, and its file text is a fixed point."""
    recording = recorded.Recording("x", "Redis", "7.0.15", "2026-12-04", "▶", tuple(made))
    text = recorded.dumps(recording)
    assert recorded.loads(text, "x") == recording
    assert recorded.dumps(recorded.loads(text, "x")) == text
    json.loads(text)  # and it is plain JSON


def test_a_file_that_is_not_a_recording_is_refused_naming_it():
    """Broken JSON, a missing field or a step with fields no Step has: BadArgument, never a
    half-made recording; an unknown name is refused naming ``name``."""
    text = (recorded.FOLDER / "etcd-restore.json").read_text(encoding="utf-8")
    broken = [text[:-5], text.replace('"version"', '"versio"'), text.replace('"worker"', '"who"', 1)]
    for bad in broken:
        with pytest.raises(BadArgument, match="not a recording of 'etcd-restore'"):
            recorded.loads(bad, "etcd-restore")
    with pytest.raises(BadArgument, match="^name: no recording 'mysql'"):
        recorded.load("mysql")


@pytest.mark.parametrize("name", recorded.NAMES)
def test_each_recording_says_where_and_when_and_draws_a_picture(name):
    """Its label names the engine, the version its server reported and the date; each of its
    runs draws, through the renderer of the live run, marks well beyond its empty frame."""
    recording = recorded.load(name)
    engine, major, date = TAKEN_ON[name]
    assert (recording.engine, recording.date, recording.button) == (engine, date, recorded.NAMES[name][2])
    assert recording.version.startswith(major) and re.fullmatch(r"\d+(\.\d+)+", recording.version)
    assert recording.label == f"recorded on {engine} {recording.version}, {date}"
    datetime.date.fromisoformat(recording.date)
    assert len(recording.runs) == (2 if name == "redis-failover" else 1)
    for run in recording.runs:
        drawn = run_of([Event(*step) for step in run.steps], params=run.params)
        assert ink(Screen().draw(drawn)) - frame_ink(drawn) > MARKS, name


# -- the lessons draw them under their buttons, with no server


def recording_cells(lesson: Path) -> dict[str, str]:
    """{recording name: the source of the code cell right under that recording's button}."""
    cells = [c["source"] for c in json.loads(lesson.read_text())["cells"] if c["cell_type"] == "code"]
    found = {}
    for name, (_, _, label) in recorded.NAMES.items():
        at = [i for i, source in enumerate(cells) if f'button("{label}"' in source]
        if at:
            assert len(at) == 1, label
            found[name] = cells[at[0] + 1]
            assert f'"{name}"' in found[name], f"{lesson.name}: no cell under {label} draws {name}"
    return found


@pytest.mark.parametrize("number", LESSONS)
def test_under_each_engine_button_the_lesson_draws_its_recording_without_any_server(
    number, monkeypatch, capsys
):
    """The cell under each ▶ engine button prints the recording's label and its stories, then
    shows each run's picture (PNG) and verdict, starting no process; the saved notebook keeps
    each picture, with at least 0.9 times the ink of a fresh drawing."""
    lesson = LESSONS[number]
    under = recording_cells(lesson)
    assert sorted(under) == sorted(n for n, (_, at, _) in recorded.NAMES.items() if at == number)
    nb = json.loads(lesson.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]

    def no_process(*args, **kwargs):
        raise AssertionError(f"a recording cell started a process: {args[:1]}")

    shown: list = []
    space: dict = {}
    exec(code[0]["source"], space)  # the lesson's imports
    for cell in code:
        if cell["source"].startswith("def show_recording"):
            exec(cell["source"], space)
    space["display"] = lambda *objects: shown.extend(objects)
    monkeypatch.setattr(subprocess, "Popen", no_process)
    for name, source in under.items():
        recording, kept = recorded.load(name), next(c for c in code if c["source"] == source)
        shown.clear()
        exec(source, space)
        said = capsys.readouterr().out
        assert said.startswith(recording.label + "\n"), said
        assert all(run.text in said for run in recording.runs)
        pictures = [o.data for o in shown if type(o).__name__ == "Image"]
        verdicts = [o.data for o in shown if type(o).__name__ == "HTML"]
        assert len(pictures) == len(verdicts) == len(recording.runs)
        saved = [o["data"]["image/png"] for o in kept["outputs"] if "image/png" in o.get("data", {})]
        assert len(saved) == len(pictures), f"{lesson.name}: the saved cell of {name}"
        for run, png, verdict, stored in zip(recording.runs, pictures, verdicts, saved):
            drawn = run_of([Event(*step) for step in run.steps], params=run.params)
            assert ink(png) - frame_ink(drawn) > MARKS and drawn.verdict in verdict
            assert ink(base64.b64decode(stored)) >= 0.9 * ink(png)


# -- a fresh real run tells the recorded story


def require_engine(name: str) -> None:
    """Skip loudly without the recording's engine (fail under its LABKIT_REQUIRE_ variable)."""
    if name == "postgres-rowlock":
        return require_postgres()
    missing = redis_missing() if name.startswith("redis") else etcd_missing()
    require(f"the recording {name}", missing, "LABKIT_REQUIRE_ENGINES")


@pytest.mark.parametrize("name", recorded.NAMES)
def test_a_fresh_real_run_tells_the_recorded_story(name):
    """Played now on this machine's server, the button's runs have the recording's verdict, the
    same kinds of steps (worker, action, outcome, target) in the same order, the same pattern of
    tokens and the same ✓ and ✗; nothing is left running. The same comparison finds the
    recording with two of its steps swapped a different story."""
    require_engine(name)
    before = set(servers.descendants(os.getpid()))
    fresh, kept = recorded.play(name), recorded.load(name)
    assert set(servers.descendants(os.getpid())) <= before  # (a session's PostgreSQL may run)
    assert re.fullmatch(r"\d+(\.\d+)+", fresh.version), fresh.version
    assert differences(fresh, kept) == []
    first = kept.runs[0]
    i = next(i for i in range(len(first.steps) - 1) if first.steps[i][1:] != first.steps[i + 1][1:])
    swapped = list(first.steps)
    swapped[i : i + 2] = swapped[i + 1], swapped[i]
    altered = replace(kept, runs=(replace(first, steps=tuple(swapped)), *kept.runs[1:]))
    assert differences(fresh, altered) != []


# -- the comparison itself, on the recordings


def altered(run: recorded.Recorded, how: str) -> recorded.Recorded:
    """``run`` changed in one way a different story would change it."""
    steps = list(run.steps)
    if how == "timings":  # not a different story: every time later and stretched
        later = lambda t: None if t is None else 2 * t + 0.5
        moved = [s._replace(time=later(s.time), until=later(s.until), began=later(s.began)) for s in steps]
        return replace(run, steps=tuple(moved))
    if how == "order":
        steps[-2], steps[-1] = steps[-1], steps[-2]
    elif how == "outcome":  # the last write turns the other way
        i = max(i for i, s in enumerate(steps) if s.action == "write")
        flip = "ok" if steps[i].outcome == "rejected" else "rejected"
        steps[i] = steps[i]._replace(outcome=flip)
    elif how == "tokens":  # the last token becomes one above all before it
        top = max((s.generation for s in steps if isinstance(s.generation, int)), default=0)
        steps[-1] = steps[-1]._replace(generation=top + 100)
    elif how == "dropped":
        del steps[len(steps) // 2]
    elif how == "marks":
        return replace(run, text=run.text.replace("✓", "✗", 1) if "✓" in run.text else "✓ " + run.text)
    return replace(run, steps=tuple(steps))


@pytest.mark.parametrize("name", recorded.NAMES)
@pytest.mark.parametrize("how", ["order", "outcome", "tokens", "dropped", "marks"])
def test_a_recording_altered_into_another_story_is_told_apart(name, how):
    """Swapped steps, a write that turns the other way, a token out of pattern, a step missing,
    or another ✓ or ✗: the comparison the fresh runs pass reports each, for every recording."""
    kept = recorded.load(name)
    changed = replace(kept, runs=(altered(kept.runs[0], how), *kept.runs[1:]))
    assert differences(changed, kept) != []


@pytest.mark.parametrize("name", recorded.NAMES)
def test_other_timings_alone_are_the_same_story(name):
    """Every time moved and stretched (a slower machine): no difference is reported."""
    kept = recorded.load(name)
    changed = replace(kept, runs=tuple(altered(run, "timings") for run in kept.runs))
    assert differences(changed, kept) == []
