"""`make lab`: the URL it prints is the one the server accepts, on a free port, without a display,
and its kernels' websockets send without delay."""

import os
import pathlib
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

from polling import wait_for
from test_lab_server import kernel_websocket_nodelay

ROOT = pathlib.Path(__file__).resolve().parents[1]


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def status_or_none(url: str) -> int | None:
    try:
        return status(url)
    except OSError:  # not listening yet
        return None


def take(port: int) -> socket.socket:
    """Listen on ``port`` ourselves, once whoever holds it now (a test on the other core that
    runs `make lab` too) lets it go; bounded, so a port held for good fails the test plainly."""
    for _ in range(1200):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            return sock
        except OSError:
            sock.close()
            time.sleep(0.1)
    raise AssertionError(f"port {port} stayed taken for 2 minutes")


def test_make_lab_prints_a_url_whose_token_works(tmp_path):
    """With 8888 taken and no display, make lab picks another port and says there is no browser."""
    taken = take(8888)  # held by this test: another test's `make lab` may hold it only for a while
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "TOKEN", "PORT")}
    env["JUPYTER_CONFIG_DIR"] = str(tmp_path / "config")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    lab = subprocess.Popen(["make", "-s", "lab"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        said = [lab.stdout.readline(), lab.stdout.readline()]
        assert "No display here" in said[0]
        url = re.search(r"http://127\.0\.0\.1:(\d+)/lab\?token=(\S+)", said[1])
        assert url, said
        port, token = url.groups()
        assert port != "8888"
        api = f"http://127.0.0.1:{port}/api/status"
        wait_for(lambda: status_or_none(api), "JupyterLab to answer", timeout=60)
        assert status(f"{api}?token={token}") == 200
        assert status(api) == 403
        assert kernel_websocket_nodelay(lab.pid, int(port), token) == 1  # a slider's messages go at once
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait()
        taken.close()
