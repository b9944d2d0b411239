"""Timelines, outcome maps, presenter mode and the slider panel that redraws them."""

import html
import subprocess
import sys

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from labkit import BadArgument  # noqa: E402
from labkit.views.plot import outcome_map, present, timeline  # noqa: E402
from labkit.scenarios import SCENARIOS, bypass_writer, expired_but_alive, lock_wait  # noqa: E402
from labkit.sim import Result  # noqa: E402
from labkit.views.widgets import TimelineRenderer, explore, replay  # noqa: E402

LEGEND = ["lease held", "lease expires (authority)", "paused", "waiting for the lock", "read",
          "lease request refused", "lease renewed (authority)", "write accepted",
          "write replaced later", "write rejected (stale)", "repeat stopped by key", "crash",
          "answer lost", "violation (harm in the data)", "warning (acted after its lease)",
          "fence token"]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_timeline_saves_a_png_with_a_lane_per_worker_and_the_full_legend(tmp_path):
    """The timeline has one lane per worker plus the fence, the fixed legend, and the verdict as title."""
    result = expired_but_alive(protected=False)
    ax = timeline(result)
    path = tmp_path / "timeline.png"
    ax.figure.savefig(path, dpi=60)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["A", "B", "fence"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == LEGEND
    assert ax.get_title(loc="left").replace("\n", " ") == result.verdict


def test_timeline_marks_each_write_by_its_fate():
    """Accepted, replaced and rejected writes are drawn with their own colours at their times."""
    ax = timeline(bypass_writer(protected=False))
    by_colour = {}
    for line in ax.get_lines():
        by_colour.setdefault(line.get_color(), []).extend(line.get_xdata())
    assert by_colour["#D55E00"] == [30.0]                # A's fenced INV-1 with 7: rejected
    assert by_colour["#CC79A7"] == [12.5]                # B's INV-2: replaced by A's export
    # B's INV-1, and A's unfenced INV-2, set apart from A's refused release at the same t=31
    assert sorted(by_colour["#009E73"]) == [11.5, pytest.approx(31.0, abs=0.5)]


def test_timeline_draws_into_given_axes():
    """With ax=, the timeline draws there and returns those axes."""
    fig, ax = plt.subplots()
    assert timeline(expired_but_alive(), ax=ax) is ax


def test_timeline_accepts_a_bare_result_and_caps_lanes():
    """A Result without tables (as grading.replay builds) draws; a 100-contender herd shows at most 14 lanes."""
    result = expired_but_alive()
    bare = Result(params={"seed": 1}, history=result.history, tables={}, violations=(), verdict="replayed")
    assert timeline(bare).get_title(loc="left") == "replayed"
    herd = SCENARIOS["herd"](contenders=100)
    assert len(timeline(herd).get_yticklabels()) <= 15


def test_renderer_is_deterministic_and_changes_with_the_run():
    """The panel's renderer gives equal PNG bytes for equal runs and different bytes for different ones."""
    renderer = TimelineRenderer()
    first = renderer.png(expired_but_alive(pause=30))
    assert first[:4] == b"\x89PNG"
    assert renderer.png(expired_but_alive(pause=30)) == first
    assert renderer.png(expired_but_alive(pause=5)) != first


def test_outcome_map_shows_a_longer_lease_only_moves_the_boundary():
    """Over pause x ttl the naive run fails once the pause outlasts the lease, for every ttl."""
    pauses, ttls = [0, 5, 10, 20, 40, 60], [5, 15, 30]
    ax = outcome_map(expired_but_alive, ("pause", pauses), ("ttl", ttls))
    cells = ax.images[0].get_array()
    first_bad = [next(i for i, c in enumerate(row) if c != 0) for row in cells.tolist()]
    assert first_bad == sorted(first_bad) and first_bad[0] < first_bad[-1]
    assert all(all(c != 0 for c in row[i:]) for row, i in zip(cells.tolist(), first_bad))
    safe = outcome_map(expired_but_alive, ("pause", [0, 60]), ("ttl", [5]), protected=True)
    assert safe.images[0].get_array().tolist() == [[0, 0]]


def test_present_changes_settings_only_when_called_and_restores_them():
    """Presenter mode enlarges fonts and lines on request and puts the old settings back."""
    before = dict(matplotlib.rcParams)
    with present():
        assert matplotlib.rcParams["font.size"] == 18 and matplotlib.rcParams["lines.linewidth"] == 3
    assert dict(matplotlib.rcParams) == before
    present()
    assert matplotlib.rcParams["font.size"] == 18
    present(False)
    assert dict(matplotlib.rcParams) == before


def test_importing_labkit_changes_no_matplotlib_setting():
    """No settings are changed at import time."""
    code = ("import matplotlib as m; d = dict(m.rcParams); import labkit, labkit.views.plot, labkit.views.widgets, "
            "labkit.scenarios; print(d == dict(m.rcParams))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_panel_redraws_in_place():
    """Moving a slider reruns the scenario and replaces the one inline PNG (never stacks a second)."""
    panel = explore(expired_but_alive, pause=(0, 60, 1), ttl=(5, 30, 1), protected=False)
    assert list(panel.controls) == ["pause", "ttl", "seed", "protected"]
    before = panel.image.outputs
    assert len(before) == 1 and "image/png" in before[0]["data"]
    assert panel.result.violations
    panel.controls["pause"].value = 5
    assert len(panel.image.outputs) == 1 and panel.image.outputs != before
    assert panel.result.violations == () and panel.result.params["pause"] == 5
    panel.controls["protected"].value = True
    assert panel.result.params["protected"] is True
    assert ">INV-1</td>" in panel.tables.value
    assert html.escape(panel.result.verdict) in panel.verdict.value


def test_panel_rejects_unknown_knobs_and_holds_fixed_ones():
    """A name that is not a knob is refused by name; a plain value holds a knob fixed."""
    with pytest.raises(BadArgument) as bad:
        explore(expired_but_alive, pasue=(0, 10))
    assert bad.value.argument == "pasue"
    panel = explore(expired_but_alive, ttl=20)
    assert "ttl" not in panel.controls and panel.result.params["ttl"] == 20


def test_replay_honours_live_seconds_and_ends_like_an_unpaced_run(monkeypatch):
    """The paced replay fits in LABKIT_LIVE_SECONDS and ends with the same history as a plain run."""
    monkeypatch.setenv("LABKIT_LIVE_SECONDS", "0.3")
    result = replay(lock_wait, protected=False)
    assert result.history == lock_wait(protected=False).history


@pytest.mark.parametrize("module", ["views.plot", "views.widgets"])
def test_docstring_examples_hold(module):
    """Every example in the views' docstrings runs and shows what it says."""
    import doctest
    import importlib
    result = doctest.testmod(importlib.import_module(f"labkit.{module}"))
    assert result.attempted > 0 and result.failed == 0
