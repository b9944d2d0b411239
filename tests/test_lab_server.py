"""The lab's server sends a kernel's messages at once: its kernel websocket has TCP_NODELAY.

With Nagle's algorithm on (jupyter_server's default), a slider press's small messages waited for
the browser's delayed ACK, about 35 ms of every other press. The test reads the option off the
server's own socket for a real kernel websocket: it takes a duplicate of that descriptor from
the running server (``pidfd_getfd``) and asks the kernel. ``test_make_lab`` asks it of the
server that ``make lab`` starts."""

import asyncio
import contextlib
import ctypes
import json
import os
import socket
import urllib.request
import uuid
from pathlib import Path

from tornado.websocket import websocket_connect

from browser_support import LabServer
from labkit.engines import servers

ROOT = Path(__file__).resolve().parent.parent
PIDFD_GETFD = 438  # the syscall's number on x86-64 and arm64


def server_end(pid: int, server_port: int, client_port: int) -> socket.socket:
    """A duplicate of the server's end of the loopback connection ``server_port`` <->
    ``client_port``, taken from ``pid`` or a process below it (``make lab`` runs the server)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    ends = f"{server_port:04X}", f"{client_port:04X}"
    inode = next(r.split()[9] for r in rows if (r.split()[1][-4:], r.split()[2][-4:]) == ends)
    for holder in (pid, *servers.descendants(pid)):
        for fd in os.listdir(f"/proc/{holder}/fd"):
            with contextlib.suppress(OSError):  # closed meanwhile: not the one
                if os.readlink(f"/proc/{holder}/fd/{fd}") == f"socket:[{inode}]":
                    return socket.socket(fileno=duplicate(holder, int(fd)))
    raise AssertionError(f"no process holds the server's end of :{server_port} <-> :{client_port}")


def duplicate(pid: int, fd: int) -> int:
    """A descriptor of this process for ``pid``'s ``fd`` (``pidfd_getfd``: ptrace rights)."""
    libc, pidfd = ctypes.CDLL(None, use_errno=True), os.pidfd_open(pid)
    try:
        mine = libc.syscall(PIDFD_GETFD, pidfd, fd, 0)
    finally:
        os.close(pidfd)
    assert mine >= 0, f"pidfd_getfd: {os.strerror(ctypes.get_errno())} (it needs ptrace rights)"
    return mine


def kernel_websocket_nodelay(pid: int, port: int, token: str) -> int:
    """Start a kernel on the server at ``port`` (process ``pid`` or below it), open its websocket
    and get one reply on it (so the server's side is open); TCP_NODELAY on the server's end."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/kernels", method="POST", headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        kernel = json.loads(response.read())["id"]
    url = f"ws://127.0.0.1:{port}/api/kernels/{kernel}/channels?token={token}"
    header = {"msg_id": uuid.uuid4().hex, "username": "test", "session": uuid.uuid4().hex,
              "msg_type": "kernel_info_request", "version": "5.3", "date": ""}
    ask = {"header": header, "parent_header": {}, "metadata": {}, "content": {}, "channel": "shell"}

    async def option() -> int:
        ws = await websocket_connect(url)
        try:
            await ws.write_message(json.dumps(ask))
            assert await asyncio.wait_for(ws.read_message(), 60) is not None
            with server_end(pid, port, ws.stream.socket.getsockname()[1]) as theirs:
                return theirs.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        finally:
            ws.close()

    return asyncio.run(option())


def test_the_browser_tests_server_sends_a_kernels_messages_without_delay(tmp_path):
    """The server the browser test and the slider benchmark start (with make lab's options)."""
    server = LabServer.start(ROOT, tmp_path)
    try:
        port = int(server.base_url.rsplit(":", 1)[1])
        assert kernel_websocket_nodelay(server.process.pid, port, server.token) == 1
    finally:
        server.stop()
