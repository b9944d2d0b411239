"""Support code for the real-browser notebook test (``tests/test_browser.py``).

Two halves:

* ``LabServer`` starts a throwaway JupyterLab on a free loopback port with
  isolated Jupyter config/data/settings dirs, and stops it again.
* The page helpers drive one notebook in that JupyterLab through Playwright:
  wait for the kernel, run all cells, inspect outputs, move a slider.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect
except ImportError:  # test_browser.py skips (or fails) before any page helper runs
    PlaywrightTimeout = expect = None

# Settings applied through the app-level overrides.json (keys checked against
# the schemas of the installed JupyterLab 4):
# - windowingMode "none" keeps every cell in the DOM, so selectors see them all;
# - the notification settings stop JupyterLab from reaching out to the web;
# - no autosave, so a run in the browser never writes outputs into the course.
LAB_OVERRIDES = {
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
    "@jupyterlab/apputils-extension:notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}

# How long the course's live demos run inside the browser test.
LIVE_SECONDS = "2"

# Kernel status item in the status bar, e.g. "Python 3 (ipykernel) | Idle".
KERNEL_IDLE = r"\(ipykernel\) \| Idle"

# JupyterLab renders error outputs and stderr streams alike (mime type
# application/vnd.jupyter.stderr); an error is told apart by its text.
# SyntaxErrors carry no "Traceback" line, hence the second alternative.
ERROR_TEXT = re.compile(r"Traceback|^\w*(Error|Exception)\b", re.MULTILINE)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LabServer:
    """A JupyterLab server process serving ``root`` on the loopback interface."""

    process: subprocess.Popen
    base_url: str
    token: str
    log_path: Path

    @classmethod
    def start(cls, root: Path, workdir: Path, timeout: float = 60) -> LabServer:
        """Start JupyterLab on ``root``, keeping all its state under ``workdir``."""
        port, token = free_port(), secrets.token_hex(16)
        app_settings = workdir / "app-settings"
        app_settings.mkdir(parents=True)
        (app_settings / "overrides.json").write_text(json.dumps(LAB_OVERRIDES, indent=2))
        log_path = workdir / "jupyterlab.log"
        command = [
            str(Path(sys.executable).with_name("jupyter")),
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            f"--LabApp.app_settings_dir={app_settings}",
            "--LabApp.extension_manager=readonly",  # never query PyPI
            "--ServerApp.kernel_websocket_connection_class=labkit.course.lab.Connection",  # as make lab
            # An absolute path keeps .ipynb_checkpoints out of the notebook folder.
            f"--FileCheckpoints.checkpoint_dir={workdir / 'checkpoints'}",
            "--allow-root",  # CI runs as root; the server refuses otherwise
        ]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                env=_server_env(workdir),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = cls(process, f"http://127.0.0.1:{port}", token, log_path)
        server._wait_until_ready(timeout)
        return server

    def notebook_url(self, relative_path: str) -> str:
        """URL that opens ``relative_path`` in a fresh (reset) workspace."""
        return f"{self.base_url}/lab/tree/{quote(relative_path)}?reset&token={self.token}"

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server log, for failure messages."""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def shutdown_kernels(self) -> None:
        """Shut down every running kernel through the REST API."""
        for kernel in self._api("GET", "/api/kernels"):
            self._api("DELETE", f"/api/kernels/{kernel['id']}")

    def stop(self) -> None:
        """Stop the server by its PID: kernels first, then SIGTERM, then SIGKILL.

        Kernels run in sessions of their own, so they are shut down through the
        API (and by the server on SIGTERM); SIGKILL is the last resort.
        """
        if self.process.poll() is not None:
            return
        with contextlib.suppress(OSError):  # SIGTERM stops the kernels as well
            self.shutdown_kernels()
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session, see start()
            self.process.wait(timeout=15)

    def _api(self, method: str, path: str):
        request = urllib.request.Request(
            self.base_url + path,
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def _wait_until_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited early:\n{self.log_tail()}")
            try:
                self._api("GET", "/api/status")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"JupyterLab not ready after {timeout} s:\n{self.log_tail()}")


def _server_env(workdir: Path) -> dict[str, str]:
    """Environment for the server and its kernels, isolated from the user's Jupyter."""
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)  # let ipykernel pick the inline backend
    env["LABKIT_LIVE_SECONDS"] = LIVE_SECONDS
    for name, sub in [
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTERLAB_SETTINGS_DIR", "user-settings"),
        ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
        ("IPYTHONDIR", "ipython"),
    ]:
        env[name] = str(workdir / sub)
    return env


# --- page helpers (``page`` is a Playwright Page, ``cell`` a Locator) ---

# True once a Run All has finished: kernel idle, no "[*]" prompt left, and at
# least one code cell numbered (outputs were cleared first, so numbers are new).
_RUN_FINISHED_JS = r"""(idle) => {
    const status = document.querySelector('#jp-main-statusbar')?.innerText ?? '';
    const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
        .map((prompt) => prompt.innerText);
    return new RegExp(idle).test(status)
        && !prompts.some((text) => text.includes('*'))
        && prompts.some((text) => /\[\d+\]/.test(text));
}"""

# True once the cell's first widget-output image is a PNG other than ``before``.
_PLOT_CHANGED_JS = r"""([cell, before]) => {
    const src = cell.querySelector('.widget-output img')?.getAttribute('src') ?? '';
    return src.startsWith('data:image/png;base64,') && src !== before;
}"""

_PNG_SRC = re.compile(r"^data:image/png;base64,")


def open_notebook(page, url: str, timeout_ms: float) -> None:
    """Open a notebook and wait until its kernel reports idle."""
    page.goto(url)
    wait_for_kernel_idle(page, timeout_ms)


def wait_for_kernel_idle(page, timeout_ms: float) -> None:
    """Wait until the status bar reads "... (ipykernel) | Idle"."""
    expect(page.locator("#jp-main-statusbar"), "kernel never became idle").to_contain_text(
        re.compile(KERNEL_IDLE), timeout=timeout_ms
    )


def choose_menu_item(page, menu: str, item: str) -> None:
    """Click ``menu`` in the main menu bar, then ``item`` in its drop-down."""
    page.locator(f'.lm-MenuBar-itemLabel:text-is("{menu}")').click()
    page.locator(f'.lm-Menu-itemLabel:text-is("{item}")').click()


def run_all_cells(page, timeout_ms: float) -> None:
    """Clear saved outputs, run every cell, and wait until the run is over."""
    choose_menu_item(page, "Edit", "Clear Outputs of All Cells")
    choose_menu_item(page, "Run", "Run All Cells")
    _wait_until(page, _RUN_FINISHED_JS, KERNEL_IDLE, timeout_ms, "Run All did not finish")


def error_outputs(page) -> list[str]:
    """Texts of all rendered outputs that show a Python error."""
    stderr = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    return [text for text in stderr.all_inner_texts() if ERROR_TEXT.search(text)]


def unexecuted_cells(page) -> list[str]:
    """Sources of non-empty code cells that have no execution number.

    Run All stops at the first error, so the cells after it stay unexecuted.
    """
    unexecuted = []
    for cell in page.locator(".jp-CodeCell").all():
        prompt = cell.locator(".jp-InputPrompt").inner_text()
        source = cell.locator(".cm-content").inner_text().strip()
        if source and not re.search(r"\[\d+\]", prompt):
            unexecuted.append(source)
    return unexecuted


def first_slider_cell(page):
    """The first code cell whose output holds an ipywidgets slider."""
    return page.locator(".jp-CodeCell").filter(has=page.locator(".widget-slider")).first


def plot_src(cell, timeout_ms: float) -> str:
    """The PNG ``src`` of the first image inside a widget Output area of ``cell``."""
    image = cell.locator(".widget-output img").first
    expect(image, "no PNG plot inside the slider cell's widget Output").to_have_attribute(
        "src", _PNG_SRC, timeout=timeout_ms
    )
    return image.get_attribute("src")


def nudge_slider(cell, presses: int) -> None:
    """Move the cell's first slider to the right with the keyboard."""
    handle = cell.locator(".widget-slider .noUi-handle").first
    handle.focus()
    for _ in range(presses):
        handle.press("ArrowRight")


def wait_for_new_plot(page, cell, before: str, timeout_ms: float) -> None:
    """Wait until the cell's plot is a PNG different from ``before``."""
    arg = [cell.element_handle(), before]
    _wait_until(page, _PLOT_CHANGED_JS, arg, timeout_ms, "the plot did not change")


def play_buttons(page):
    """The ▶ buttons of the instructor cells, in notebook order."""
    return page.locator(".jp-CodeCell button.jupyter-button", has_text="▶").all()


# True once the clicked ▶ button is enabled again (its action has returned) and the output
# under it shows a verdict or an observation (✓ or ✗) and at least ``pictures`` images.
_STORY_SHOWN_JS = r"""([button, pictures]) => {
    const box = button.closest('.widget-vbox');
    const text = box?.querySelector('.widget-output')?.innerText ?? '';
    return !button.disabled && /[✓✗]/.test(text) && box.querySelectorAll('img').length >= pictures;
}"""

# The PNG data of every image under a ▶ button, in page order.
_BUTTON_PICTURES_JS = r"""(button) => [...button.closest('.widget-vbox').querySelectorAll('img')]
    .map((img) => img.getAttribute('src') ?? '')"""


def click_and_wait_for_story(page, button, timeout_ms: float, pictures: int = 0) -> str:
    """Click an instructor cell's ▶ button; wait until its story and ``pictures`` images are
    shown and return its text."""
    button.scroll_into_view_if_needed()
    button.click()
    handle = button.element_handle()
    failure = f"{button.inner_text()!r} showed no story (or fewer than {pictures} pictures)"
    _wait_until(page, _STORY_SHOWN_JS, [handle, pictures], timeout_ms, failure)
    return handle.evaluate(
        "(b) => b.closest('.widget-vbox').querySelector('.widget-output').innerText"
    )


def button_pictures(button) -> list[bytes]:
    """The images under a ▶ button, as the PNG bytes the kernel sent."""
    sources = button.element_handle().evaluate(_BUTTON_PICTURES_JS)
    return [base64.b64decode(_PNG_SRC.sub("", src)) for src in sources if _PNG_SRC.match(src)]


def panel_cells(page) -> list:
    """The code cells whose output holds a slider panel, in notebook order."""
    return page.locator(".jp-CodeCell").filter(has=page.locator(".widget-slider")).all()


def _wait_until(page, js: str, arg, timeout_ms: float, failure: str) -> None:
    """``page.wait_for_function`` that fails with a readable AssertionError."""
    try:
        page.wait_for_function(js, arg=arg, timeout=timeout_ms)
    except PlaywrightTimeout:
        raise AssertionError(f"{failure} within {timeout_ms / 1000:.0f} s") from None
