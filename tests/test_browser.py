"""Real-browser test of the course notebooks: JupyterLab + headless Chromium.

For every ``notebooks/*.ipynb`` it opens the notebook in JupyterLab, runs all
cells (recording the Run All time in ``build/run_all_seconds.json``), checks that
no output shows an error, saves each slider panel in its initial state to
``build/screenshots/<stem>-panel-<k>.png``, moves the first slider with the
keyboard and checks that the plot under it changes, clicks every instructor ▶
button and checks that it tells its story in words and draws each picture that its
action draws when called directly (saved to ``<stem>-button-<k>-<i>.png``), and
saves a full-page screenshot to ``build/screenshots/<notebook-stem>.png``.

Environment:

* ``LABKIT_NOTEBOOK_ROOT`` - folder that holds ``notebooks/`` (default: the
  project root); JupyterLab serves this folder.
* ``LABKIT_REQUIRE_BROWSER=1`` - fail instead of skip when Chromium or
  Playwright is missing.

Needs Debian's ``/usr/bin/chromium`` and the ``playwright`` Python package;
never run ``playwright install``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path

import pytest

from labkit.engines.servers import sweep
from prerequisites import require

from direct_buttons import direct_pictures, ink
import presenter_sizes

from browser_support import (
    LIVE_SECONDS,
    LabServer,
    button_pictures,
    error_outputs,
    first_slider_cell,
    click_and_wait_for_story,
    nudge_slider,
    open_notebook,
    panel_cells,
    play_buttons,
    plot_src,
    run_all_cells,
    unexecuted_cells,
    wait_for_kernel_idle,
    wait_for_new_plot,
)

PROJECT = Path(__file__).resolve().parent.parent
NOTEBOOK_ROOT = Path(os.environ.get("LABKIT_NOTEBOOK_ROOT", PROJECT)).resolve()
SCREENSHOTS = PROJECT / "build" / "screenshots"
RUN_ALL_TIMES = PROJECT / "build" / "run_all_seconds.json"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 1000}

KERNEL_TIMEOUT_MS = 30_000
RUN_TIMEOUT_MS = 45_000
STORY_TIMEOUT_MS = 60_000
PLOT_TIMEOUT_MS = 15_000
SLIDER_PRESSES = 3

NOTEBOOKS = sorted((NOTEBOOK_ROOT / "notebooks").glob("*.ipynb"))


def missing_prerequisite() -> str | None:
    """Why the browser test cannot run here, or None when it can."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} not found; install with `apt-get install -y chromium`"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is missing; install with `pip install -e '.[test]'`"
    return None


def require_browser() -> None:
    """Skip loudly, or fail under LABKIT_REQUIRE_BROWSER=1, if the browser can't run."""
    require("browser test", missing_prerequisite(), "LABKIT_REQUIRE_BROWSER")


@pytest.fixture(scope="module")
def lab_server():
    """One JupyterLab server serving NOTEBOOK_ROOT for the whole module."""
    require_browser()
    with tempfile.TemporaryDirectory(prefix="labkit-jupyter-") as workdir:
        server = LabServer.start(NOTEBOOK_ROOT, Path(workdir))
        try:
            yield server
        finally:
            server.stop()
            for prefix in ("labkit-run-", "labkit-server-"):  # left by the kernels' demos
                sweep(prefix)


@pytest.fixture(scope="module")
def browser(lab_server):
    """One headless Debian Chromium, driven by Playwright.

    Requests ``lab_server`` first, so the prerequisites are checked before the import.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, lab_server):
    """A fresh page per notebook; its kernels are shut down afterwards."""
    new_page = browser.new_page(viewport=VIEWPORT)
    yield new_page
    new_page.close()
    lab_server.shutdown_kernels()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def test_notebook_in_browser(notebook: Path, lab_server, page):
    """Run the notebook in JupyterLab; its slider must redraw the plot."""
    started = time.monotonic()
    url = lab_server.notebook_url(notebook.relative_to(NOTEBOOK_ROOT).as_posix())
    try:
        open_notebook(page, url, KERNEL_TIMEOUT_MS)
        ran = time.monotonic()
        run_all_cells(page, RUN_TIMEOUT_MS)
        record_run_all_time(notebook.stem, time.monotonic() - ran)
        check_outputs(page)
        save_panel_screenshots(page, notebook.stem)
        check_slider_redraws_plot(page)
        check_outputs(page)  # the slider's callbacks must not fail either
        check_play_buttons_draw_their_story(page, notebook)
        check_outputs(page)
    finally:
        save_screenshot(page, notebook.stem)
        print(f"{notebook.name}: {time.monotonic() - started:.1f} s in the browser")


def test_presenter_mode_enlarges_every_text_half_again_on_screen(lab_server, page):
    """In a 1400 px window, presenter mode shows every text of a timeline, a panel and a replay
    (legend, tick and axis labels, the picture's labels, title, caption, verdict, tables, slider
    labels) at >= 1.5x its size without, in CSS px, the panel's and the replay's pictures at
    >= 1.5x the lesson's own timeline's; a panel made in a ``with present():`` block shows."""
    import nbformat

    notebook = NOTEBOOK_ROOT / "build" / "presenter-check.ipynb"
    notebook.parent.mkdir(exist_ok=True)
    cells = [nbformat.v4.new_code_cell(source) for source in presenter_sizes.sources()]
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata=kernel), notebook)
    url = lab_server.notebook_url(notebook.relative_to(NOTEBOOK_ROOT).as_posix())
    open_notebook(page, url, KERNEL_TIMEOUT_MS)
    run_all_cells(page, RUN_TIMEOUT_MS)
    check_outputs(page)
    sizes = presenter_sizes.measure(page)
    save_screenshot(page, "presenter-check")
    rows = presenter_sizes.ratios(sizes)
    for picture, kind, normal, big in rows:
        print(f"{picture:>20} {kind:>16}: {normal:7.1f} -> {big:7.1f} CSS px, {big / normal:.2f}x")
    assert len(sizes) == 6, f"pictures measured: {sorted(sizes)}"
    small = [f"{p} {k}: {b / n:.2f}x" for p, k, n, b in rows if not n or b < 1.5 * n]
    assert not small, "presenter mode enlarges these less than 1.5x: " + ", ".join(small)


def check_outputs(page) -> None:
    """No output shows an error, and every code cell ran."""
    errors = error_outputs(page)
    assert not errors, "cell outputs show errors:\n" + "\n-----\n".join(errors)
    skipped = unexecuted_cells(page)
    assert not skipped, "code cells did not run:\n" + "\n-----\n".join(skipped)


def check_slider_redraws_plot(page) -> None:
    """Moving the first slider with the keyboard changes the plot below it."""
    cell = first_slider_cell(page)
    assert cell.count(), "no ipywidgets slider (.widget-slider) in the notebook"
    cell.scroll_into_view_if_needed()
    before = plot_src(cell, PLOT_TIMEOUT_MS)
    nudge_slider(cell, SLIDER_PRESSES)
    wait_for_new_plot(page, cell, before, PLOT_TIMEOUT_MS)
    wait_for_kernel_idle(page, KERNEL_TIMEOUT_MS)


def record_run_all_time(stem: str, seconds: float) -> None:
    """Print a lesson's Run All time and keep it in build/run_all_seconds.json."""
    print(f"{stem}: Run All took {seconds:.1f} s")
    RUN_ALL_TIMES.parent.mkdir(parents=True, exist_ok=True)
    times = json.loads(RUN_ALL_TIMES.read_text()) if RUN_ALL_TIMES.exists() else {}
    RUN_ALL_TIMES.write_text(
        json.dumps({**times, stem: round(seconds, 1)}, indent=1, sort_keys=True)
    )


def save_panel_screenshots(page, stem: str) -> None:
    """Save each slider panel, in its initial state, to build/screenshots/<stem>-panel-<k>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for k, cell in enumerate(panel_cells(page), start=1):
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=str(SCREENSHOTS / f"{stem}-panel-{k}.png"))


def check_play_buttons_draw_their_story(page, notebook: Path) -> None:
    """Each instructor ▶ button, clicked, tells its story in words (✓ or ✗, never a raw dict)
    and draws every picture that its action draws when called directly, each with at least
    0.9 of that picture's ink (0.6 for a run of real processes or servers, which differs from
    one run to the next); saved to build/screenshots/<stem>-button-<k>-<i>.png."""
    buttons = play_buttons(page)
    assert buttons, "no ▶ button for the instructor cells"
    direct = direct_pictures(notebook, {"LABKIT_LIVE_SECONDS": LIVE_SECONDS})
    assert len(direct) == len(buttons), "the page's ▶ buttons are not the lesson's"
    for k, (button, expected) in enumerate(zip(buttons, direct), start=1):
        label = button.inner_text()
        assert expected, f"{label!r}: its action draws no picture even when called directly"
        story = click_and_wait_for_story(page, button, STORY_TIMEOUT_MS, len(expected))
        assert "{" not in story, f"{label!r} shows a raw value: {story!r}"
        seen = button_pictures(button)
        assert len(seen) == len(expected), f"{label!r}: {len(seen)} pictures, not {len(expected)}"
        share = 0.6 if ("real" in label or "live demo" in label) else 0.9
        for i, (shown, reference) in enumerate(zip(seen, expected), start=1):
            (SCREENSHOTS / f"{notebook.stem}-button-{k}-{i}.png").write_bytes(shown)
            assert ink(shown) > share * ink(reference), (
                f"{label!r}, picture {i}: {ink(shown)} inked pixels, the same action called "
                f"directly drew {ink(reference)}"
            )
        wait_for_kernel_idle(page, KERNEL_TIMEOUT_MS)


def save_screenshot(page, stem: str) -> None:
    """Save a full-page screenshot to build/screenshots/<stem>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{stem}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
