"""The lab's server sends a kernel's messages at once: its kernel websocket has TCP_NODELAY.

With Nagle's algorithm on (jupyter_server's default), a slider press's small messages waited for
the browser's delayed ACK, about 35 ms of every other press. The test reads the option off the
server's own socket for a real kernel websocket: it takes a duplicate of that descriptor from
the running server (``pidfd_getfd``) and asks the kernel. ``test_make_lab`` asks it of the
server that ``make lab`` starts."""

import asyncio
import ctypes
import json
import os
import socket
import urllib.request
from pathlib import Path

from tornado.websocket import websocket_connect

from browser_support import LabServer

ROOT = Path(__file__).resolve().parent.parent
PIDFD_GETFD = 438  # the syscall's number on x86-64 and arm64


def server_end(server_port: int, client_port: int) -> socket.socket:
    """A duplicate of the server's end of the loopback connection ``server_port`` <-> ``client_port``,
    taken from whichever process holds it."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    ends = f"{server_port:04X}", f"{client_port:04X}"
    inode = next(r.split()[9] for r in rows if (r.split()[1][-4:], r.split()[2][-4:]) == ends)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = {n: os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
        except OSError:  # gone, or not ours to read
            continue
        for fd, target in fds.items():
            if target == f"socket:[{inode}]":
                libc, pidfd = ctypes.CDLL(None, use_errno=True), os.pidfd_open(int(pid))
                try:
                    mine = libc.syscall(PIDFD_GETFD, pidfd, int(fd), 0)
                finally:
                    os.close(pidfd)
                assert mine >= 0, os.strerror(ctypes.get_errno())
                return socket.socket(fileno=mine)
    raise AssertionError(f"no process holds the server's end of :{server_port} <-> :{client_port}")


def kernel_websocket_nodelay(port: int, token: str) -> int:
    """Start a kernel on the server at ``port``, open its websocket; TCP_NODELAY on the server's end."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/kernels", method="POST", headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        kernel = json.loads(response.read())["id"]
    url = f"ws://127.0.0.1:{port}/api/kernels/{kernel}/channels?token={token}"

    async def option() -> int:
        ws = await websocket_connect(url)
        try:
            with server_end(port, ws.stream.socket.getsockname()[1]) as theirs:
                return theirs.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        finally:
            ws.close()

    return asyncio.run(option())


def test_the_browser_tests_server_sends_a_kernels_messages_without_delay(tmp_path):
    """The server the browser test and the slider benchmark start (with make lab's options)."""
    server = LabServer.start(ROOT, tmp_path)
    try:
        assert kernel_websocket_nodelay(int(server.base_url.rsplit(":", 1)[1]), server.token) == 1
    finally:
        server.stop()
