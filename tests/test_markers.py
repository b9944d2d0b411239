"""Nothing hides anything: in every timeline a lesson draws and every lesson panel, at its start
and at each control's ends, no marker covers another unless it is drawn on top, leaves the one
below showing and has an outline of its own.

The boxes come from what is drawn (the marker artists' data, size and colours, through the axes'
transform), not from the run's events, so a fault anywhere between the run and the pixels shows."""

import itertools

import matplotlib
import pytest
from matplotlib.colors import to_rgba
from matplotlib.lines import Line2D
from matplotlib.markers import MarkerStyle

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import labkit.scenarios  # noqa: E402
from labkit.views.plot import present, timeline  # noqa: E402
from labkit.views.widgets import explore  # noqa: E402
from test_pictures import values  # noqa: E402
from test_timeline_readable import CALL_IDS, CALLS, TIMELINE_IDS, TIMELINES  # noqa: E402


def markers(ax, lines) -> list[dict]:
    """Every marker ``lines`` (in draw order) put on ``ax``: its box in display pixels, its fill
    (None when hollow or a stroke such as ``x``) and its edge colour and width."""
    out, px = [], ax.figure.dpi / 72
    for order, line in enumerate(lines):
        style = MarkerStyle(line.get_marker())
        face = to_rgba(line.get_markerfacecolor())
        solid = style.is_filled() and style.get_fillstyle() != "none" and face[3] > 0
        edge, width = to_rgba(line.get_markeredgecolor()), line.get_markeredgewidth()
        half = (line.get_markersize() + width) * px / 2
        for x, y in ax.transData.transform(line.get_xydata()) if len(line.get_xdata()) else []:
            box = (x - half, y - half, x + half, y + half)
            kind = f"{line.get_marker()} {line.get_markerfacecolor()}"
            m = dict(box=box, fill=face if solid else None, edge=edge, width=width, kind=kind)
            out.append(m | dict(order=order, ink=face if solid else edge))
    return out


def area(box) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def common(a, b) -> float:
    return area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))


def outside(ax, drawn: list[dict]) -> list:
    """The markers whose centre is off the axes (set apart past the edge of the chart)."""
    (x0, y0), (x1, y1) = ax.get_window_extent().get_points()
    centres = [((b[0] + b[2]) / 2, (b[1] + b[3]) / 2, m["kind"]) for m in drawn for b in [m["box"]]]
    return [c for c in centres if not (x0 <= c[0] <= x1 and y0 <= c[1] <= y1)]


def hidden(drawn: list[dict]) -> list[tuple]:
    """The pairs whose boxes cover each other by more than half, where the one drawn on top fills
    over half of the one below, or has no outline of its own against it (an edge of another
    colour than the one below's ink, or a rim that lies outside it)."""
    faults = []
    for low, top in itertools.combinations(sorted(drawn, key=lambda m: m["order"]), 2):
        shared = common(low["box"], top["box"])
        if shared <= 0.5 * min(area(low["box"]), area(top["box"])):
            continue
        encloses = common(low["box"], top["box"]) >= area(low["box"]) - 1e-9
        outlined = top["width"] > 0 and (top["edge"] != low["ink"] or encloses and not top["fill"])
        covers = top["fill"] is not None and shared > 0.5 * area(low["box"])
        if covers or not outlined:
            faults.append((low["kind"], low["box"][:2], "under", top["kind"]))
    return faults


@pytest.fixture
def drawn_lines(monkeypatch):
    """The lines drawn, in the order drawn (the panel's renderer draws its artists itself)."""
    seen, draw = [], Line2D.draw

    def record(line, renderer):
        seen.append(line)
        return draw(line, renderer)

    monkeypatch.setattr(Line2D, "draw", record)
    return seen


def lines_of(ax, seen: list) -> list:
    """The marker lines of ``ax`` among the lines ``seen`` drawn, in that order."""
    on_ax = {id(line) for line in ax.lines}
    return [a for a in seen if id(a) in on_ax and a.get_marker() not in (None, "None", "")]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("presenting", [False, True], ids=["normal", "presenter"])
@pytest.mark.parametrize("name, run", TIMELINES, ids=TIMELINE_IDS)
def test_no_marker_hides_another_in_a_lesson_timeline(name, run, presenting, drawn_lines):
    """Every plot.timeline a lesson's cells draw, in normal and in presenter mode (bigger marks)."""
    with present(presenting):
        ax = timeline(run)
        ax.figure.canvas.draw()
    drawn = markers(ax, lines_of(ax, drawn_lines))
    assert hidden(drawn) == [] and outside(ax, drawn) == [], f"{name}: {run.params}"


def knob_settings(panel) -> list[dict]:
    """The panel's start, then each control at its ends and its middle (the others at the start):
    both toggle states, every dropdown option."""
    start = {name: control.value for name, control in panel.controls.items()}
    settings = [start]
    for name, control in panel.controls.items():
        every = values(control)
        ends = (
            every if hasattr(control, "options") else [every[0], every[len(every) // 2], every[-1]]
        )
        settings += [{**start, name: v} for v in dict.fromkeys(ends) if v != start[name]]
    return settings


def panel_markers(panel, seen: list) -> list[dict]:
    """The markers of the panel's picture, drawn again by its renderer, in the order drawn."""
    renderer = panel.renderer  # (which draws the shown picture first if it came from the panel's cache)
    seen.clear()
    renderer.png(panel.result)
    ax = renderer.canvas.figure.axes[0]
    return markers(ax, lines_of(ax, seen))


@pytest.mark.parametrize("name, call", CALLS, ids=CALL_IDS)
def test_no_marker_hides_another_in_a_lesson_panel(name, call, drawn_lines):
    """Every lesson panel, by its cell's own call, at its start and each control's ends and middle."""
    panel = eval(call, {"explore": explore, **vars(labkit.scenarios)})
    seen, faults = 0, []
    for knobs in knob_settings(panel):
        for control, value in knobs.items():
            panel.controls[control].value = value
        if panel.result is None:  # a refusal in words: no picture to check
            continue
        seen += 1
        drawn = panel_markers(panel, drawn_lines)
        found = hidden(drawn) + outside(panel.renderer.canvas.figure.axes[0], drawn)
        faults += [(knobs, f) for f in found[:3]]
    assert seen and faults == [], f"{name}: {len(faults)} faults, first {faults[:4]}"


def test_the_known_hidden_crashes_are_caught(drawn_lines):
    """The check finds the fault it is for: lesson 07's B crashes right after its write, and the
    crash must show; a star drawn under a write dot of about its size is a fault."""
    run = labkit.scenarios.crash_after_fence(protected=False, crash_after=1)
    ax = timeline(run)
    ax.figure.canvas.draw()
    drawn = markers(ax, lines_of(ax, drawn_lines))
    stars = [m for m in drawn if m["kind"].startswith("*")]
    assert stars, "lesson 07 with crash_after=1 draws B's crash"
    star, dot = dict(stars[0]), dict(stars[0])
    dot.update(order=star["order"] + 1, fill=to_rgba("#009E73"), ink=to_rgba("#009E73"), kind="o")
    dot.update(edge=to_rgba("white"))
    assert hidden([star, dot]) != []


@pytest.mark.parametrize(
    "run",
    [
        labkit.scenarios.crash_after_fence(protected=False, crash_after=1),
        labkit.scenarios.crash_after_fence(protected=False, crash_after=2),
        labkit.scenarios.email_transfer(protected=True, relay_crashes=1),
    ],
    ids=["07:crash_after=1", "07:crash_after=2", "08:relay crash at t=12"],
)
def test_a_crash_right_after_a_write_shows_beside_it(run, drawn_lines):
    """The cases the lessons were walked for: lesson 07's B crashing after its write (t=11) and
    lesson 08's relay crashing after its email (t=12): the star and the write both show."""
    ax = timeline(run)
    ax.figure.canvas.draw()
    drawn = markers(ax, lines_of(ax, drawn_lines))
    assert any(m["kind"].startswith("*") for m in drawn)
    assert hidden(drawn) == []
