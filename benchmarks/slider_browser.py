"""Slider key press to new picture in Chromium, lessons 01, 02, 05 and 08 (issue 23 / 27).

Opens each lesson in a throwaway JupyterLab (tests/browser_support.py), runs all cells, then
presses ArrowRight / ArrowLeft on the first slider's handle, one press at a time. Each press is
timed inside the page, from the keydown event to the frame after the new PNG under the slider
has loaded (``img.decode()`` then ``requestAnimationFrame``). Prints p50 / p95 / max per lesson.

Target: p95 <= 50 ms in each lesson. Run: ``.venv/bin/python benchmarks/slider_browser.py
[--presses 40] [--only 01 ...]``. Needs /usr/bin/chromium and playwright.
"""

from __future__ import annotations

import argparse
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
    const box = cell.querySelector('.widget-output');
    const src = () => box.querySelector('img')?.getAttribute('src') ?? '';
    const before = src();
    let start = null;
    handle.addEventListener('keydown', () => { start = performance.now(); }, {once: true});
    const seen = new MutationObserver(async () => {
        const img = box.querySelector('img');
        if (start === null || !img || src() === before) return;
        seen.disconnect();
        await img.decode().catch(() => null);
        requestAnimationFrame(() => resolve(performance.now() - start));
    });
    seen.observe(box, {subtree: true, childList: true, attributes: true});
    setTimeout(() => { seen.disconnect(); resolve(-1); }, 10000);
})})"""


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def time_presses(page, presses: int) -> list[float]:
    """Press the first slider's handle ``presses`` times (right, then back left): ms per press."""
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
        page.wait_for_timeout(60)  # let the kernel go idle between presses
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presses", type=int, default=40)
    parser.add_argument("--only", nargs="*", default=None)
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
                    open_notebook(page, server.notebook_url(f"notebooks/{notebook.name}"), 30_000)
                    run_all_cells(page, 60_000)
                    times = time_presses(page, args.presses)
                    p95 = percentile(times, 95)
                    worst = max(worst, p95)
                    print(f"{notebook.stem:32} {percentile(times, 50):8.1f} {p95:8.1f} "
                          f"{max(times):8.1f}  {'ok' if p95 <= 50 else 'OVER'} ({len(times)} timed)",
                          flush=True)
                    page.close()
                    server.shutdown_kernels()
                browser.close()
        finally:
            server.stop()
    print(f"worst p95: {worst:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
