"""The picture is a function of the knobs: every lesson panel, moved along any path, shows the PNG a
fresh renderer draws for the same knobs; and every slider position draws or refuses in words."""

import asyncio
import base64
import functools
import io
import re

import matplotlib
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

matplotlib.use("Agg")

import labkit.scenarios  # noqa: E402
from labkit.views.scene import OTHERS, PAUSE_WORDS  # noqa: E402
from labkit.views.widgets import TimelineRenderer, explore, tables_html  # noqa: E402
from test_panels import CELLS  # noqa: E402

CALLS = [(name, call) for name, _, call in CELLS]
IDS = [f"{name[:2]}:{call[8:30]}" for name, call in CALLS]
NOISE = r"\d\.\d*(\d)\1{4,}\d*"  # a float as repr prints it: 19.999999999999996, 0.30000000000000004
SETTINGS = settings(
    max_examples=3, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


@functools.cache
def panel(call: str):
    """The panel a lesson cell builds, by its own call (one per call, reused by every example)."""
    made = eval(call, {"explore": explore, **vars(labkit.scenarios)})
    made.start = {name: control.value for name, control in made.controls.items()}
    return made


def shown(p) -> bytes:
    """The PNG bytes the panel's Output shows."""
    return base64.b64decode(p.image.outputs[0]["data"]["image/png"])


def values(control) -> list:
    """Every value a control can take (a slider's steps, a dropdown's options, both toggle states)."""
    if hasattr(control, "options"):
        return list(control.options)
    if isinstance(control.value, bool):
        return [False, True]
    n = round((control.max - control.min) / control.step)
    return [type(control.value)(control.min + k * control.step) for k in range(n + 1)]


def anchors(p, name) -> list:
    """A control's ends, middle and start: the values a path comes back to most."""
    every = values(p.controls[name])
    return list(dict.fromkeys([every[0], every[-1], every[len(every) // 2], p.start[name]]))


def moves(p):
    """One move: a control and a value it can take, often one it is likely to have had before."""
    return st.sampled_from(list(p.controls)).flatmap(
        lambda name: st.tuples(
            st.just(name),
            st.sampled_from(anchors(p, name)) | st.sampled_from(values(p.controls[name])),
        )
    )


def fresh_png(p) -> bytes:
    """The knobs' picture drawn by a new renderer that has drawn nothing before."""
    run = p.scenario(
        protected=p.controls["protected"].value, seed=p.controls["seed"].value, **p.knobs()
    )
    return TimelineRenderer(lanes=p.reserved).png(run)


@pytest.mark.parametrize("name, call", CALLS, ids=IDS)
def test_a_panel_moved_along_any_path_shows_a_fresh_renderers_picture(name, call):
    """Along random paths of slider, dropdown, seed and toggle moves (starting wherever the last
    example left the panel), the PNG at each point is byte-identical to a fresh renderer's."""
    p = panel(call)

    @SETTINGS
    @given(st.data())
    def walk(data):
        path = data.draw(st.lists(moves(p), min_size=2, max_size=6))
        for control, value in path:
            p.controls[control].value = value
            if p.result is not None:
                assert shown(p) == fresh_png(p), f"{name}: after {path}"

    walk()


def test_the_lesson_00_round_trip_draws_the_first_picture_again():
    """Lesson 00's pause 30 -> 5 -> 30: the same picture as at the start, expiry and writes in
    place (the renderer once restored a cached axis without its limits)."""
    p = explore(labkit.scenarios.expired_but_alive, protected=False, pause=(0, 60, 0.5))
    first = shown(p)
    p.controls["pause"].value = 5
    assert shown(p) != first
    p.controls["pause"].value = 30
    assert shown(p) == first and p.renderer.canvas.figure.axes[0].get_xlim()[1] == 35


def test_a_panel_made_in_presenter_mode_stays_in_it_and_a_later_one_changes_nothing():
    """A panel keeps the mode it was made in: present() in a later cell does not enlarge it."""
    from labkit.views.plot import present

    p = explore(labkit.scenarios.expired_but_alive, protected=False)
    normal = shown(p)
    with present():
        big = explore(labkit.scenarios.expired_but_alive, protected=False)
        p.controls["pause"].value = 31
        p.controls["pause"].value = 30
    assert shown(p) == normal and shown(big) != normal
    big.controls["pause"].value = 31
    big.controls["pause"].value = 30
    with present():
        assert shown(big) == fresh_png(big)


def drawn_or_refused(p, where: str) -> None:
    """The panel shows a picture of its knobs, or no picture and a refusal naming its error; a
    picture has a lane for each worker of its run and none for a worker that is not in it (the
    herd's 5 contenders once got 9 lanes, and an "others" lane that said "no other workers"); and
    each control shows the value the run used (the herd's dropdown said "watch" while the
    unprotected run used "none"); its labels, verdict and tables are in plain words and numbers
    (never "paused at after-read", never 19.999999999999996)."""
    if p.result is not None:
        assert p.image.outputs and shown(p)[:4] == b"\x89PNG", where
        assert p.result.params["seed"] == p.controls["seed"].value, where
        workers = {e.worker for e in p.result.history}
        lanes = [w for w in p.renderer.lanes if w != OTHERS]
        assert set(lanes) <= workers, f"{where}: empty lanes {sorted(set(lanes) - workers)}"
        assert (OTHERS in p.renderer.lanes) == (workers > set(lanes)), where
        said = [text for text, _ in p.renderer.label_boxes]
        assert all(t.removeprefix("paused ") in PAUSE_WORDS.values() for t in said
                   if t.startswith("paused")), f"{where}: {said}"
        for shows in (p.tables.value, p.verdict.value, *said):
            assert not re.search(NOISE, shows), f"{where}: {shows}"
        used = {**p.result.params, **(p.result.tables.get("herd") or [{}])[0]}  # herd: its strategy
        for name, control in p.controls.items():
            assert control.value == used[name], f"{where}: {name} shows {control.value!r}, run {used[name]!r}"
    else:
        assert p.image.outputs == () and re.search(r"\b\w+(Error|Argument\w*|Lost|Held)\b: ", p.verdict.value), where


@pytest.mark.parametrize("name, call", CALLS, ids=IDS)
def test_every_knob_at_its_ends_and_middle_and_at_random_draws_or_refuses(name, call):
    """Each control at its ends and middle (the others where the lesson starts them), then random
    combinations of all controls: the panel never raises, and shows a picture or a refusal."""
    p = panel(call)
    for control, value in p.start.items():
        p.controls[control].value = value
    for control in p.controls:
        every = values(p.controls[control])
        for value in (every[0], every[len(every) // 2], every[-1], p.start[control]):
            p.controls[control].value = value
            drawn_or_refused(p, f"{name}: {control}={value}")

    @SETTINGS
    @given(st.fixed_dictionaries({c: st.sampled_from(values(w)) for c, w in p.controls.items()}))
    def combination(knobs):
        for control, value in knobs.items():
            p.controls[control].value = value
        drawn_or_refused(p, f"{name}: {knobs}")

    combination()


def test_the_herd_panel_draws_a_hold_past_the_ttl():
    """Lesson 06's herd with hold=8, ttl=3.5 (it raised TypeError): a picture, and the late
    release is recorded as refused."""
    p = explore(labkit.scenarios.herd, protected=False, hold=(0.0, 10.0, 0.5), ttl=(0.5, 20.0, 0.5))
    p.controls["hold"].value, p.controls["ttl"].value = 8.0, 3.5
    assert p.result is not None and shown(p)[:4] == b"\x89PNG"
    assert any(e.action == "release" and e.outcome == "lost" for e in p.result.history)


def test_the_herd_dropdown_says_the_strategy_the_run_uses():
    """Protection off, the herd's dropdown shows "none" and stays there (the run uses no backoff
    whatever is picked); on, it comes back to the lesson's "watch", and a pick is what runs."""
    p = explore(labkit.scenarios.herd, protected=False, strategy=["watch", "jitter", "none"])
    strategy = p.controls["strategy"]
    assert strategy.value == "none" and p.result.verdict.startswith("none: ")
    strategy.value = "jitter"
    assert strategy.value == "none" and p.result.verdict.startswith("none: ")
    p.controls["protected"].value = True
    assert strategy.value == "watch" and p.result.verdict.startswith("watch: ")
    strategy.value = "jitter"
    assert p.result.verdict.startswith("jitter: ")
    p.controls["protected"].value = False
    assert strategy.value == "none" and p.result.verdict.startswith("none: ")


def test_the_noise_check_sees_float_noise_and_the_tables_have_none():
    """The check above finds a float's noise, and the panel's tables print it as the eye reads it."""
    assert re.search(NOISE, "expires_at 19.999999999999996") and re.search(NOISE, "t=0.30000000000000004")
    assert not re.search(NOISE, "t=12.5, 100000 rows, 3.14159")
    shown = tables_html({"leases": [{"expires_at": 19.999999999999996, "until": 0.30000000000000004}]})
    assert ">20<" in shown and ">0.3<" in shown and not re.search(NOISE, shown)


def first_slider(p):
    """The panel's first knob slider (not the seed), as a student's arrow keys move it."""
    return next(
        (name, c)
        for name, c in p.controls.items()
        if name != "seed" and hasattr(c, "step") and hasattr(c, "max")
    )


@pytest.mark.parametrize("name, call", CALLS, ids=IDS)
def test_a_key_press_finds_its_picture_drawn_ahead_and_it_is_a_fresh_renderers(name, call):
    """In a kernel (an event loop running), a press leaves the picture one step further drawn
    while idle: the next press the same way, and every press back, runs no scenario, and each
    shows byte for byte what a fresh renderer draws for its knobs."""
    p = eval(call, {"explore": explore, **vars(labkit.scenarios)})
    knob, slider = first_slider(p)
    runs, scenario = [], p.scenario
    p.scenario = functools.wraps(scenario)(lambda **knobs: runs.append(knobs) or scenario(**knobs))
    way = 1 if slider.value + 3 * slider.step <= slider.max else -1
    presses = [way] * 3 + [-way] * 3

    async def press_keys() -> list[int]:
        counts = []
        for sign in presses:
            before = len(runs)
            slider.value = round(slider.value + sign * slider.step, 9)
            counts.append(len(runs) - before)
            assert p.result is None or shown(p) == fresh_png(p), f"{name}: {knob}={slider.value}"
            await asyncio.sleep(0)  # the kernel is idle: what was planned ahead is drawn
        return counts

    counts = asyncio.run(press_keys())
    assert counts[0] == 1 and counts[1:] == [0] * 5, f"{name}: scenario runs per press {counts}"


@pytest.mark.parametrize("name, call", CALLS, ids=IDS)
def test_the_png_holds_the_canvas_pixels_exactly(name, call):
    """The panel's PNG, decoded by Pillow, is the renderer's canvas pixel for pixel (the canvas is
    opaque, so the RGB file drops nothing)."""
    p = panel(call)
    canvas = np.asarray(p.renderer.canvas.buffer_rgba())
    decoded = np.asarray(Image.open(io.BytesIO(shown(p))))
    assert (canvas[..., 3] == 255).all() and decoded.shape == canvas[..., :3].shape
    assert (decoded == canvas[..., :3]).all()


def test_a_jump_of_several_steps_draws_nothing_ahead():
    """A drag or a click on the track jumps: nothing is drawn ahead (its guess would cost the
    next message a second run), and the next press runs its own scenario."""
    p = explore(labkit.scenarios.expired_but_alive, protected=False, pause=(0, 60, 0.5))
    runs, scenario = [], p.scenario
    p.scenario = functools.wraps(scenario)(lambda **knobs: runs.append(knobs) or scenario(**knobs))

    async def jump_then_press() -> list[int]:
        counts = []
        for value in (10.0, 10.5):  # a jump, then one step further the same way
            before = len(runs)
            p.controls["pause"].value = value
            counts.append(len(runs) - before)
            await asyncio.sleep(0)
        return counts

    assert asyncio.run(jump_then_press()) == [1, 1]  # (the step then draws 11.0 ahead)
