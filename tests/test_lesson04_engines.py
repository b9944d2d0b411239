"""Lesson 04's three ▶ buttons on real engines, played outside a kernel.

The lesson's own cells (its imports, its ``on_engine`` helper and the three button cells) run
here with ``button`` recording its action instead of drawing a widget. With the programs, each
action plays its real story and draws what happened, with the checker's verdict as the title;
without them it says what to install and draws the simulated runs, starting nothing; under
``LABKIT_REQUIRE_ENGINES=1`` a missing program raises instead.
"""

from __future__ import annotations

import json
import os
import pathlib

import matplotlib
import pytest
from prerequisites import require

from labkit.engines import etcd, etcd_cluster, redis, redis_pair, servers
from labkit.errors import LabkitError
from labkit.views import screen

LESSON = pathlib.Path(__file__).resolve().parents[1] / "notebooks/04-who-issues-the-numbers.ipynb"
LABELS = (
    "▶ run on a real Redis",
    "▶ run on a real etcd cluster",
    "▶ restore a real etcd from a snapshot",
)


def missing() -> str | None:
    """Why Redis or etcd cannot run here, or None."""
    try:
        redis_pair.require()
        etcd_cluster.require()
        import redis as _client  # noqa: F401
    except (LabkitError, ImportError) as exc:
        return str(exc)
    return None


@pytest.fixture
def lesson(monkeypatch):
    """The lesson's buttons as {label: action}, and the titles of the figures they show."""
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c["source"] for c in json.loads(LESSON.read_text())["cells"]]
    cells = [cells[1]] + [s for s in cells if "on_engine" in s]  # imports, helper, buttons
    actions, titles = {}, []

    def draw(screen, result):  # what the screen's verdict line says
        titles.append(result.verdict)
        return real_draw(screen, result)

    space: dict = {}
    exec(cells[0], space)  # the lesson's imports
    space.update(button=lambda label, action: actions.setdefault(label, action))
    for source in cells[1:]:
        exec(source, space)
    real_draw = screen.Screen.draw
    monkeypatch.setattr(screen.Screen, "draw", draw)
    assert tuple(actions) == LABELS
    return actions, titles


def absent(monkeypatch) -> None:
    """Make both engines' ``require`` raise MissingBinary, as on a machine without them."""
    for module, name in ((redis, "redis-server"), (etcd, "etcd")):

        def missing_program(name=name):
            raise servers.MissingBinary(name, name, pathlib.Path("/nowhere") / name)

        monkeypatch.setattr(module, "require", missing_program)


def test_without_the_programs_each_button_names_the_packages_and_draws_the_simulated_runs(
    lesson, monkeypatch, capsys
):
    """No server starts; the cell names the packages, then draws 2, 1 and 1 simulated runs."""
    actions, titles = lesson
    monkeypatch.delenv("LABKIT_REQUIRE_ENGINES", raising=False)
    absent(monkeypatch)
    drawn, before = [], set(servers.descendants(os.getpid()))
    for label, packages in zip(LABELS, ("redis-server", *["etcd-server etcd-client"] * 2)):
        actions[label]()
        said = capsys.readouterr().out
        assert said.startswith(f"✗ {packages.split('-')[0]}"), said
        assert "is not installed" in said, said
        assert f"sudo apt-get install -y {packages}`" in said, said
        drawn.append(len(titles))
    assert drawn == [2, 3, 4]
    assert "token 7 went to A and B" in titles[0] and "nothing lost" in titles[1]
    assert "nothing lost" in titles[2] and "locked out" in titles[3]
    assert set(servers.descendants(os.getpid())) <= before  # (a session's PostgreSQL may run)


def test_a_missing_program_raises_under_labkit_require_engines(lesson, monkeypatch):
    """LABKIT_REQUIRE_ENGINES=1: a missing program is an error, not a simulated stand-in."""
    actions, titles = lesson
    monkeypatch.setenv("LABKIT_REQUIRE_ENGINES", "1")
    absent(monkeypatch)
    for label in LABELS:
        with pytest.raises(servers.MissingBinary):
            actions[label]()
    assert titles == []


def test_each_button_plays_its_real_engine_and_draws_what_happened(lesson, capsys):
    """Redis: two holders with token 7, then (1, 7) refused; etcd: rising tokens across a leader
    kill; a restore reissues a revision and the fence refuses it. No server is left."""
    require("lesson 04 on real engines", missing(), "LABKIT_REQUIRE_ENGINES")
    actions, titles = lesson
    before = set(servers.descendants(os.getpid()))
    actions[LABELS[0]]()
    said = capsys.readouterr().out
    assert "✗ two holders with one token, 7" in said and "✓ B's (2, 7) is above A's (1, 7)" in said
    assert "A INV-2 with (1, 7): rejected" in said and said.count("the whole run took") == 2
    assert "lost_update" in titles[0] and "acted_after_expiry" not in titles[0]
    assert titles[1] == "no violation"
    actions[LABELS[1]]()
    said = capsys.readouterr().out
    assert "SIGKILLed;" in said and "✓ every token is above all before it (20" in said
    actions[LABELS[2]]()
    said = capsys.readouterr().out
    assert "✓ D holds" in said and "a token issued before, again" in said
    assert "is below the fence" in said and " s in all)" in said
    assert titles[2:] == ["no violation", "no violation"]
    assert set(servers.descendants(os.getpid())) <= before  # (a session's PostgreSQL may run)
