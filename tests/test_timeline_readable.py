"""Every timeline a lesson draws stays readable: labels never overlap, the time axis fits the run,
effects are drawn for what they are, and presenter mode really is bigger on screen."""

import itertools
import json
import re

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import labkit.scenarios  # noqa: E402
from labkit.scenarios import SCENARIOS, email_transfer, version_wait  # noqa: E402
from labkit.views.plot import present, timeline  # noqa: E402
from labkit.views.scene import PAUSE_WORDS, end_of, lanes_of, scene, x_range  # noqa: E402
from labkit.views.widgets import TimelineRenderer, explore, tables_html  # noqa: E402
from test_panels import CELLS, NOTEBOOKS  # noqa: E402

OUTPUT_PX = 964  # a notebook output's width in JupyterLab, in a 1400 px wide Chromium window


def lesson_timelines():
    """(notebook, run) for every ``timeline(...)`` a lesson's cells draw, from the cells' own code."""
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or "timeline(" not in source or "import" in source:
                continue
            drawn = []
            names = {**vars(labkit.scenarios), "timeline": drawn.append, "plt": plt}
            exec(source.replace("plt.show()", ""), names)
            yield from ((path.name, run) for run in drawn)


TIMELINES = list(lesson_timelines())
TIMELINE_IDS = [f"{name[:2]}:{run.params}" for name, run in TIMELINES]
CALLS = [(name, call) for name, _, call in CELLS]
CALL_IDS = [f"{name[:2]}:{call[8:30]}" for name, call in CALLS]


def overlapping(boxes):
    """The pairs of ``(text, (x0, y0, x1, y1))`` boxes whose areas intersect."""
    return [
        (a, b)
        for (a, (ax0, ay0, ax1, ay1)), (b, (bx0, by0, bx1, by1)) in itertools.combinations(boxes, 2)
        if min(ax1, bx1) - max(ax0, bx0) > 0.01 and min(ay1, by1) - max(ay0, by0) > 0.01
    ]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_there_are_lesson_timelines_to_check():
    """The collection finds the lessons' timelines (at least one in each of lessons 01 to 08)."""
    assert {name[:2] for name, _ in TIMELINES} >= {f"{n:02}" for n in range(1, 9)}


@pytest.mark.parametrize("name, run", TIMELINES, ids=TIMELINE_IDS)
def test_lesson_timeline_labels_never_overlap_and_the_axis_fits(name, run):
    """In every plot.timeline a lesson draws, no two labels' drawn extents overlap, and the time
    axis covers the run and ends at most 25% past its end."""
    ax = timeline(run)
    ax.figure.canvas.draw()
    labels = [p for p in ax.patches if p.get_gid() == "label"]
    assert len(labels) == len(scene(run, lanes_of(run.history), 10.0).labels)
    boxes = [(i, tuple(p.get_window_extent().extents)) for i, p in enumerate(labels)]
    assert overlapping(boxes) == []
    end, right = end_of(run.history), ax.get_xlim()[1]
    assert end < right <= 1.25 * end


@pytest.mark.parametrize("name, call", CALLS, ids=CALL_IDS)
def test_panel_labels_never_overlap_and_the_range_follows_the_run(name, call):
    """Each lesson panel, built by its cell's own call, in both modes of its initial knobs: the
    labels the renderer reports don't overlap and the range ends at most 25% past the run's end."""
    panel = eval(call, {"explore": explore, **vars(labkit.scenarios)})
    for _mode in range(2):
        renderer, end = panel.renderer, end_of(panel.result.history)
        assert renderer.label_boxes and overlapping(renderer.label_boxes) == []
        assert end < renderer.xmax <= 1.25 * end
        panel.controls["protected"].value = not panel.controls["protected"].value


def test_x_range_steps_bound_the_run_and_hold_between_steps():
    """x_range pads every end, ends within 25% of it, and is one value between two steps."""
    ends = [0.5 + 0.37 * i for i in range(4000)] + [10.0**k for k in range(-1, 5)]
    for end in ends:
        assert 1.03 * end <= x_range(end) <= 1.25 * max(end, 1.0) + 1e-9
    assert x_range(31) == x_range(32) == 35 and x_range(100) == 120


def test_a_small_slider_move_keeps_the_picture_still_and_the_frame_cached():
    """Lesson 01's panel spans the run (not the slider's far end); the range changes only when the
    run's end crosses a step, and then only the time axis is drawn anew, never the whole frame."""
    panel = explore(SCENARIOS["expired_but_alive"], protected=False, pause=(0, 90, 0.25),
                    ttl=(1, 60, 0.5))  # lesson 01's call
    assert panel.renderer.xmax == 35 and end_of(panel.result.history) == 30
    draws = []
    real_draw = panel.renderer.canvas.draw
    panel.renderer.canvas.draw = lambda: draws.append(1) or real_draw()
    panel.controls["pause"].value = 31
    assert panel.renderer.xmax == 35 and draws == []
    panel.controls["pause"].value = 60
    assert panel.renderer.xmax == 70 and draws == []
    panel.controls["ttl"].value = 20
    assert draws == []


def test_effects_at_the_same_spot_are_set_apart():
    """Lesson 08's naive run: B's email and B's report.txt (both at t=11) are drawn a marker apart."""
    ax = timeline(email_transfer(protected=False))
    xs = sorted(x for line in ax.get_lines() if line.get_color() == "#009E73"
                for x, y in line.get_xydata() if y == 1)
    assert len(xs) == 2 and 10.5 < xs[0] < 11 < xs[1] < 11.5


def test_only_a_write_is_replaced_later():
    """A second email is a duplicate effect, not a replacement: lesson 08's naive run draws no
    "write replaced later"; in every scenario, a replaced mark is a write overwritten by another."""
    ax = timeline(email_transfer(protected=False))
    assert not any(line.get_color() == "#CC79A7" and len(line.get_xdata()) for line in ax.get_lines())
    for name, fn in SCENARIOS.items():
        for protected in (False, True):
            run = fn(protected=protected)
            lanes = lanes_of(run.history)
            effects = [e for e in run.history if e.action in ("write", "email", "charge")]
            replaced = [
                e for i, e in enumerate(effects)
                if e.worker in lanes and e.outcome == "ok" and e.action == "write"
                and any(o.action == "write" and o.target == e.target and o.worker != e.worker
                        and o.outcome == "ok" for o in effects[i + 1:])
            ]
            drawn = scene(run, lanes, x_range(end_of(run.history))).points.get("overwritten", [])
            assert len(drawn) == len(replaced), (name, protected)


def test_an_acquire_without_a_lease_end_draws_no_expiry():
    """version_wait's version lock has no end: A's held span runs to the run's end, with no
    "lease expires" tick; in every scenario a tick sits at the until of an acquire or renew."""
    run = version_wait(protected=False)
    sc = scene(run, lanes_of(run.history), 40.0)
    assert [s for s in sc.spans["lease"] if s[2] == 0] == [(0.0, 34.0, 0, 0.3)]
    assert [t for t in sc.ticks if t[1] == 0] == []
    for name, fn in SCENARIOS.items():
        for protected in (False, True):
            run = fn(protected=protected)
            lanes = lanes_of(run.history)
            untils = {(e.until, e.worker) for e in run.history
                      if e.action in ("acquire", "renew") and e.outcome == "ok" and e.until is not None}
            for x, y in scene(run, lanes, x_range(end_of(run.history))).ticks:
                assert (x, lanes[y]) in untils, (name, protected, x, lanes[y])


def test_the_herd_panel_shows_how_many_contend():
    """Lesson 06's herd panel: moving contenders changes the picture, which counts the workers
    that have no lane and their refused attempts."""
    call = next(call for name, call in CALLS if name.startswith("06") and "herd" in call)
    panel = eval(call, {"explore": explore, **vars(labkit.scenarios)})
    before = panel.image.outputs[0]["data"]["image/png"]
    texts = [text for text, _ in panel.renderer.label_boxes]
    panel.controls["contenders"].value = 40
    assert panel.image.outputs[0]["data"]["image/png"] != before
    after = [text for text, _ in panel.renderer.label_boxes]
    assert texts != after
    for contenders, shown in ((100, texts), (40, after)):
        rest = [e for e in SCENARIOS["herd"](protected=False, contenders=contenders).history
                if e.worker not in panel.renderer.lanes]
        refused = sum(e.action == "acquire" and e.outcome == "held" for e in rest)
        assert f"{len({e.worker for e in rest})} more workers: {refused} refused attempts" in shown


def displayed(renderer, px: float) -> float:
    """``px`` image pixels as shown in a notebook output (scaled down to fit, never up)."""
    return px * min(1.0, OUTPUT_PX / renderer.canvas.get_width_height()[0])


def test_presenter_text_is_half_again_as_tall_on_screen():
    """In a 964 px notebook output, presenter mode's legend and label text are >= 1.5x normal."""
    run = SCENARIOS["expired_but_alive"](protected=False)
    normal = TimelineRenderer([run])
    normal.png(run)
    with present():
        big = TimelineRenderer([run])
        big.png(run)
    assert displayed(big, big.legend_text_px) >= 1.5 * displayed(normal, normal.legend_text_px)
    height = {r: {t: y1 - y0 for t, (_, y0, _, y1) in r.label_boxes} for r in (normal, big)}
    for text, tall in height[normal].items():
        assert displayed(big, height[big][text]) >= 1.5 * displayed(normal, tall), text


@pytest.mark.parametrize("protected", [False, True])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_student_reads_plain_words_and_plain_numbers(name, protected):
    """Every scenario, at its own knobs: each pause on its timeline is told in words ("paused
    after its read", never a step's internal name such as "at after-read"), and its panel's
    tables show no float noise (20, not 19.999999999999996)."""
    run = SCENARIOS[name](protected=protected)
    lanes = lanes_of(run.history)
    said = [text for text, *_, kind in scene(run, lanes, x_range(end_of(run.history))).labels]
    for text in (t for t in said if t.startswith("paused")):
        assert text.removeprefix("paused ") in PAUSE_WORDS.values(), text
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", tables_html(run.tables))
    noisy = [c for c in cells if re.fullmatch(r"-?\d+\.\d{7,}", c)]
    assert not noisy, noisy
