"""Slider key press to new picture in Chromium, lessons 01, 02, 05 and 08 (issue 23 / 27).

Opens each lesson in a throwaway JupyterLab (tests/browser_support.py), runs all cells, then
presses ArrowRight / ArrowLeft on the first slider's handle, one press at a time. Each press is
timed inside the page, from the keydown event to the frame after the new PNG under the slider
has loaded (``img.decode()`` then ``requestAnimationFrame``). Prints p50 / p95 / max per lesson.

``--profile`` also splits each press into stages: timestamps in the page (keydown, the comm
message sent and the picture's message received on the kernel websocket, the picture's node in
the DOM, decoded, next frame) and in the kernel (an IPython startup file in the throwaway
IPYTHONDIR: the widget's message handled, the panel's update begun, the PNG drawn, the
picture's message sent), both on the epoch clock in ms. Prints p50 / p95 per stage.

Target: p95 <= 50 ms in each lesson. Run: ``.venv/bin/python benchmarks/slider_browser.py
[--presses 40] [--only 01 ...] [--profile]``. Needs /usr/bin/chromium and playwright.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser_support import LabServer, open_notebook, run_all_cells  # noqa: E402

LESSONS = ("01", "02", "05", "08")

# An object whose promise ``done`` resolves with the ms from the handle's next keydown to the frame after a new picture shows.
_TIMED_PRESS_JS = r"""([cell, handle]) => ({done: new Promise((resolve) => {
    // the panel's picture: a widgets.Image's <img>, or (before #27) an <img> in a widgets.Output
    const box = cell.querySelector('img.widget-image')?.parentElement ?? cell.querySelector('.widget-output');
    const picture = () => box.querySelector('img.widget-image, .widget-output img');
    const src = () => picture()?.getAttribute('src') ?? '';
    const before = src();
    let start = null, shown = null, decoded = null;
    const epoch = (t) => performance.timeOrigin + t;
    // capture phase: the slider's own keydown handler sends the new value before it returns
    document.addEventListener('keydown', () => {
        start = performance.now();
        (window.__probe ??= []).length = 0;
    }, {capture: true, once: true});
    const seen = new MutationObserver(async () => {
        const img = picture();
        if (start === null || !img || src() === before) return;
        seen.disconnect();
        shown = performance.now();
        await img.decode().catch(() => null);
        decoded = performance.now();
        requestAnimationFrame(() => {
            const end = performance.now();
            window.__last = {keydown: epoch(start), shown: epoch(shown), decoded: epoch(decoded),
                             frame: epoch(end), ws: (window.__probe ?? []).slice()};
            resolve(end - start);
        });
    });
    seen.observe(box, {subtree: true, childList: true, attributes: true});
    setTimeout(() => { seen.disconnect(); resolve(-1); }, 10000);
})})"""


# Run in the page before JupyterLab: the epoch ms of each kernel websocket frame, with its msg_type,
# comm method and state keys (read from the frame's first 4 kB; v1 protocol frames are binary).
_WS_PROBE_JS = r"""(() => {
    const Base = window.WebSocket, head = new TextDecoder();
    const about = (data) => {
        const text = typeof data === 'string' ? data.slice(0, 4096)
            : head.decode(new Uint8Array(data.buffer ?? data, data.byteOffset ?? 0,
                                         Math.min(4096, data.byteLength)));
        const type = /"msg_type":\s*"(\w+)"/.exec(text)?.[1] ?? '?';
        const method = /"method":\s*"(\w+)"/.exec(text)?.[1] ?? '';
        const keys = /"state":\s*\{"(\w+)"/.exec(text)?.[1]
            ?? /"buffer_paths":\s*\[\["(\w+)"/.exec(text)?.[1] ?? '';  // bytes go in buffers
        return {type, method, keys, bytes: data.byteLength ?? data.length};
    };
    window.WebSocket = class extends Base {
        constructor(...args) {
            super(...args);
            this.addEventListener('message', (event) => (window.__probe ??= []).push(
                {dir: 'in', t: performance.timeOrigin + performance.now(), ...about(event.data)}));
        }
        send(data) {
            (window.__probe ??= []).push(
                {dir: 'out', t: performance.timeOrigin + performance.now(), ...about(data)});
            return super.send(data);
        }
    };
})()"""

# An IPython startup file for the kernel: appends one JSON line per event to $LABKIT_PROBE_LOG.
_KERNEL_PROBE = r"""
import json, os, time
import ipywidgets
from labkit.views import render, widgets as _panels

_log = open(os.environ["LABKIT_PROBE_LOG"], "a", buffering=1)

def _mark(what, **more):
    _log.write(json.dumps({"t": time.time() * 1000, "what": what, **more}) + "\n")

def _wrap(owner, name, before, after=None):
    inner = getattr(owner, name)
    def wrapped(self, *args, **kwargs):
        before(self, *args)
        value = inner(self, *args, **kwargs)
        if after:
            _mark(after)
        return value
    setattr(owner, name, wrapped)

_wrap(ipywidgets.Widget, "_handle_msg", lambda self, msg: _mark(
    "recv", method=msg["content"]["data"].get("method", ""),
    sent=msg["header"].get("date").timestamp() * 1000 if msg["header"].get("date") else None))
_wrap(_panels.Explorer, "update", lambda self: _mark("update"), "updated")
_wrap(render.TimelineRenderer, "png", lambda self, result: _mark("png"), "png_done")
from ipykernel.iostream import IOPubThread as _IOPub

def _zmq_sent(self, msg, *args, **kwargs):
    head = b"".join(part if isinstance(part, bytes) else bytes(part) for part in msg[-3:])[:4096]
    if b'"update"' in head and (b'"outputs"' in head or b'"value"' in head):
        _mark("zmq")
    return _really_send(self, msg, *args, **kwargs)

_really_send, _IOPub._really_send = _IOPub._really_send, _zmq_sent
_wrap(ipywidgets.Widget, "_send", lambda self, msg, buffers=None: _mark(
    "send", method=msg.get("method", ""),
    keys=",".join([*msg.get("state", {}), *(path[0] for path in msg.get("buffer_paths", []))])))
"""

# A jupyter_server_config.py for the server: marks when the picture's message comes off the kernel's
# zmq socket and when its websocket frame is written, in the same log ("s_in", "s_out").
_SERVER_PROBE = r"""
import json, os, time
from jupyter_server.services.kernels.connection import channels

_log = open(os.environ["LABKIT_PROBE_LOG"], "a", buffering=1)
_Conn = channels.ZMQChannelsWebsocketConnection

def _picture(parts):
    head = b"".join(bytes(p) for p in parts[-4:])[:4096]
    return b'"update"' in head and (b'"outputs"' in head or b'"value"' in head)

def _outgoing(self, stream, msg_list, _inner=_Conn.handle_outgoing_message):
    picture = _picture(msg_list)
    if picture:
        _log.write(json.dumps({"t": time.time() * 1000, "what": "s_in"}) + "\n")
    _inner(self, stream, msg_list)
    if picture:
        _log.write(json.dumps({"t": time.time() * 1000, "what": "s_out"}) + "\n")

_Conn.handle_outgoing_message = _outgoing
"""

# (name, start event, end event) of each stage of one press, in order.
STAGES = (
    ("key->ws send", "keydown", "ws_out"),
    ("ws send->kernel msg", "ws_out", "k_recv"),
    ("kernel msg->update", "k_recv", "k_update"),
    ("update->png start (rerun)", "k_update", "k_png"),
    ("png draw+encode", "k_png", "k_png_done"),
    ("png->picture sent", "k_png_done", "k_send"),
    ("picture sent->iopub thread sent", "k_send", "k_zmq"),
    ("iopub thread->server got it", "k_zmq", "k_s_in"),
    ("server relay", "k_s_in", "k_s_out"),
    ("server wrote->ws recv", "k_s_out", "ws_in"),
    ("ws recv->img in DOM", "ws_in", "shown"),
    ("img in DOM->decoded", "shown", "decoded"),
    ("decoded->next frame", "decoded", "frame"),
    ("kernel update total", "k_update", "k_updated"),
)


def press_events(page_marks: dict, kernel_marks: list[dict]) -> dict[str, float]:
    """One press's events (epoch ms) from the page's and the kernel's marks."""
    start, end = page_marks["keydown"], page_marks["frame"]
    ws = page_marks["ws"]
    events = {k: page_marks[k] for k in ("keydown", "shown", "decoded", "frame")}
    out = [m for m in ws if m["dir"] == "out" and m["type"] == "comm_msg"]
    picture = [m for m in ws if m["dir"] == "in" and m["method"] == "update"
               and m["keys"] in PICTURE_KEYS]
    if out:
        events["ws_out"] = out[0]["t"]
    if picture:
        events["ws_in"] = picture[0]["t"]
    window = [m for m in kernel_marks if start - 5 <= m["t"] <= end + 5]
    firsts = {}
    for mark in window:
        name = mark["what"]
        if name == "send" and not (mark["method"] == "update" and mark["keys"] in PICTURE_KEYS):
            continue
        if name == "recv" and mark["method"] != "update":
            continue
        firsts.setdefault(name, mark["t"])
    events.update({f"k_{k}": v for k, v in firsts.items()})
    return events


#: the first state key of the message that carries a new picture
PICTURE_KEYS = ("outputs", "value")


def print_stages(all_events: list[dict]) -> None:
    """p50 / p95 ms of each stage over the presses that have both of its events."""
    for name, a, b in STAGES:
        spans = [e[b] - e[a] for e in all_events if a in e and b in e]
        if spans:
            print(f"    {name:30} {percentile(spans, 50):7.1f} {percentile(spans, 95):7.1f}"
                  f"  ({len(spans)})")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def time_presses(page, presses: int, marks: list | None = None) -> list[float]:
    """Press the first slider's handle ``presses`` times (right, then back left): ms per press;
    each timed press's page marks appended to ``marks``."""
    cell = page.locator(".jp-CodeCell").filter(has=page.locator(".widget-slider")).first
    cell.scroll_into_view_if_needed()
    handle = cell.locator(".widget-slider .noUi-handle").first
    handle.focus()
    times = []
    for i in range(presses):
        key = "ArrowRight" if (i // 5) % 2 == 0 else "ArrowLeft"
        waiting = page.evaluate_handle(_TIMED_PRESS_JS, [cell.element_handle(), handle.element_handle()])
        handle.press(key)
        ms = waiting.evaluate("(o) => o.done")
        if ms >= 0:
            times.append(ms)
            if marks is not None:
                marks.append(page.evaluate("() => window.__last"))
        page.wait_for_timeout(60)  # let the kernel go idle between presses
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presses", type=int, default=40)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--profile", action="store_true", help="split each press into stages")
    args = parser.parse_args(argv)
    if not Path("/usr/bin/chromium").exists():
        print("no /usr/bin/chromium: skipped")
        return 0
    from playwright.sync_api import sync_playwright

    lessons = args.only or LESSONS
    print(f"slider key to picture in Chromium, {args.presses} presses each; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'lesson':32} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}  target: p95 <= 50 ms")
    with tempfile.TemporaryDirectory(prefix="labkit-jupyter-") as workdir:
        probe_log = Path(workdir) / "kernel-probe.jsonl"
        if args.profile:
            startup = Path(workdir) / "ipython" / "profile_default" / "startup"
            startup.mkdir(parents=True)
            (startup / "00-labkit-probe.py").write_text(_KERNEL_PROBE)
            (Path(workdir) / "config").mkdir()
            (Path(workdir) / "config" / "jupyter_server_config.py").write_text(_SERVER_PROBE)
            os.environ["LABKIT_PROBE_LOG"] = str(probe_log)
        server = LabServer.start(ROOT, Path(workdir))
        worst = 0.0
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"]
                )
                for lesson in lessons:
                    notebook = next((ROOT / "notebooks").glob(f"{lesson}-*.ipynb"))
                    page = browser.new_page(viewport={"width": 1400, "height": 1000})
                    if args.profile:
                        page.add_init_script(_WS_PROBE_JS)
                    open_notebook(page, server.notebook_url(f"notebooks/{notebook.name}"), 30_000)
                    run_all_cells(page, 60_000)
                    marks: list = []
                    times = time_presses(page, args.presses, marks if args.profile else None)
                    p95 = percentile(times, 95)
                    worst = max(worst, p95)
                    print(f"{notebook.stem:32} {percentile(times, 50):8.1f} {p95:8.1f} "
                          f"{max(times):8.1f}  {'ok' if p95 <= 50 else 'OVER'} ({len(times)} timed)",
                          flush=True)
                    if args.profile:
                        kernel = [json.loads(line) for line in probe_log.read_text().splitlines()]
                        print_stages([press_events(m, kernel) for m in marks])
                    page.close()
                    server.shutdown_kernels()
                browser.close()
        finally:
            server.stop()
    print(f"worst p95: {worst:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
