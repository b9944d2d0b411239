"""The browser's half of the presenter size test (``tests/test_browser.py``).

A notebook draws a timeline, a panel and a replay, each without and with presenter mode; the
kernel prints each picture's text boxes (``tests/presenter_probe.py``). In the page, for every
box, the ink found in the shown image, times the image's on-screen scale, is the text's size in
CSS pixels; for the HTML around a picture (verdict, tables, slider labels) it is the computed
font size."""

from __future__ import annotations

import base64
import hashlib
import json
import math
from pathlib import Path

PROBE = Path(__file__).with_name("presenter_probe.py")
SETUP = """
from labkit.scenarios import expired_but_alive
from labkit.views.plot import present, timeline
from labkit.views.render import TimelineRenderer
from labkit.views.scene import end_of, x_range
from labkit.views.widgets import explore, replay
run = expired_but_alive(protected=False)
def replay_renderer():  # the one replay(expired_but_alive, protected=False) draws with
    return TimelineRenderer([run], xmax=x_range(max(end_of(run.history), 1.0)))
"""
#: one picture a cell; "presenter" names the presenter-mode twin of a picture
CELLS = [
    "ax = timeline(run)\ntimeline_probe('timeline', ax)",
    "with present():\n    ax = timeline(run)\ntimeline_probe('timeline presenter', ax)",
    (
        "panel = explore(expired_but_alive, protected=False)\ndisplay(panel)\n"
        "renderer_probe('panel', panel.renderer, panel.result)"
    ),
    (
        "with present():\n    panel = explore(expired_but_alive, protected=False)\n"
        "renderer_probe('panel presenter', panel.renderer, panel.result)"
    ),
    (
        "done = replay(expired_but_alive, protected=False, speed=50)\n"
        "renderer_probe('replay', replay_renderer(), done)"
    ),
    (
        "with present():\n    done = replay(expired_but_alive, protected=False, speed=50)\n"
        "    later = replay_renderer()\n"
        "renderer_probe('replay presenter', later, done)"
    ),
]


def sources() -> list[str]:
    return [PROBE.read_text() + SETUP, *CELLS]


# For each box: the width and height of the ink in it, and its tallest band of inked rows (one
# line of a wrapped text), in image pixels. Ink: a pixel darker than light grey.
_INK_JS = r"""async (cell, boxes) => {
    const img = cell.querySelector('.jp-OutputArea-output img');
    await img.decode();
    const w = img.naturalWidth, h = img.naturalHeight;
    const canvas = document.createElement('canvas');
    canvas.width = w; canvas.height = h;
    const context = canvas.getContext('2d');
    context.drawImage(img, 0, 0);
    const data = context.getImageData(0, 0, w, h).data;
    const dark = (x, y) => {
        const i = 4 * (y * w + x), a = data[i + 3] / 255;
        const lum = 0.299 * data[i] + 0.587 * data[i + 1] + 0.114 * data[i + 2];
        return 255 - a * (255 - lum) < 170;
    };
    const ink = {};
    for (const [kind, list] of Object.entries(boxes)) {
        ink[kind] = list.map(([x0, y0, x1, y1]) => {
            const left = Math.max(0, Math.floor(x0) - 1), right = Math.min(w, Math.ceil(x1) + 1);
            const top = Math.max(0, Math.floor(y0) - 1), bottom = Math.min(h, Math.ceil(y1) + 1);
            let xs = [Infinity, -1], ys = [Infinity, -1], band = 0, tallest = 0;
            for (let y = top; y < bottom; y++) {
                let row = false;
                for (let x = left; x < right; x++) {
                    if (!dark(x, y)) continue;
                    row = true;
                    xs = [Math.min(xs[0], x), Math.max(xs[1], x)];
                }
                if (row) ys = [Math.min(ys[0], y), Math.max(ys[1], y)];
                band = row ? band + 1 : 0;
                tallest = Math.max(tallest, band);
            }
            return [Math.max(0, xs[1] - xs[0] + 1), Math.max(0, ys[1] - ys[0] + 1), tallest];
        });
    }
    const shown = img.getBoundingClientRect().width;
    return {scale: shown / w, size: [w, h], src: img.getAttribute('src'), ink: ink};
}"""

# The computed font size (CSS px) of each kind of HTML text in a cell's output.
_HTML_JS = r"""(cell) => {
    const size = (el) => (el ? parseFloat(getComputedStyle(el).fontSize) : null);
    const htmls = [...cell.querySelectorAll('.widget-html-content')];
    const find = (re) => htmls.find((el) => re.test(el.innerText.trim()));
    const inner = (el) => el?.querySelector('div, b') ?? el;
    const found = {
        'slider labels': size(cell.querySelector('.widget-slider .widget-label')),
        'slider readouts': size(cell.querySelector('.widget-slider .widget-readout')),
        'toggle button': size(cell.querySelector('.widget-toggle-button')),
        'verdict': size(inner(find(/^[✓✗]/))),
        'tables': size(cell.querySelector('.widget-html-content td')),
        'panel title': size(find(/ — /)),
        'replay clock': size(inner(find(/^live/))),
    };
    return Object.fromEntries(Object.entries(found).filter(([, v]) => v !== null));
}"""


def _text_size(width: float, height: float, tallest: float, lines: int) -> float:
    """One text's linear size in image pixels: the ink's geometric mean for one line of text
    (less rounding than its height alone), its tallest line's height for a wrapped one."""
    return math.sqrt(width * height) if lines == 1 else tallest


def measure(page) -> dict[str, dict[str, float]]:
    """Picture name -> text kind -> the size the user sees, in CSS px (summed over its texts)."""
    found = {}
    for cell in page.locator(".jp-CodeCell").all():
        printed = cell.locator(".jp-OutputArea-output").all_inner_texts()
        probes = [line for t in printed for line in t.splitlines() if line.startswith("PROBE ")]
        if not probes:
            continue
        probe = json.loads(probes[0].removeprefix("PROBE "))
        boxes = {kind: [b[:4] for b in list_] for kind, list_ in probe["boxes"].items()}
        handle = cell.element_handle()
        found[probe["name"]] = _sizes(
            probe, handle.evaluate(_INK_JS, boxes), handle.evaluate(_HTML_JS)
        )
    return found


def _sizes(probe: dict, shown: dict, html: dict) -> dict[str, float]:
    png = base64.b64decode(shown["src"].split(",", 1)[1])
    name = probe["name"]
    assert hashlib.sha256(png).hexdigest() == probe["sha256"], f"{name}: not the probed picture"
    off = max(abs(a - b) for a, b in zip(shown["size"], probe["size"]))  # matplotlib rounds
    assert off <= 1, f"{name}: {shown['size']} px, probed {probe['size']}"
    sizes = {}
    for kind, boxes in probe["boxes"].items():
        texts = [_text_size(*ink, box[4]) for ink, box in zip(shown["ink"][kind], boxes)]
        assert all(texts), f"{name}: a {kind} text has no ink where its box is"
        sizes[kind] = shown["scale"] * sum(texts)
    return {**sizes, **html}


def ratios(sizes: dict) -> list[tuple[str, str, float, float]]:
    """(picture, text kind, size without, size with presenter mode) for every kind of each
    picture, and for a panel's or a replay's picture texts against the lesson's own timeline's
    (a kind missing on one side counts as size 0)."""
    rows = []
    for picture in ("timeline", "panel", "replay"):
        normal, big = sizes.get(picture, {}), sizes.get(f"{picture} presenter", {})
        rows += [(picture, kind, normal.get(kind, 0), big.get(kind, 0)) for kind in normal | big]
    lesson = sizes.get("timeline", {})
    for picture in ("panel", "replay"):
        big = sizes.get(f"{picture} presenter", {})
        shared = [kind for kind in lesson if kind in big]
        rows += [(f"{picture} vs timeline", kind, lesson[kind], big[kind]) for kind in shared]
    return rows
