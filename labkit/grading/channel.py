"""The pipe under :mod:`labkit.grading.wire`: newline-framed JSON messages with deadlines.

The judge bounds every whole send and receive by its clock, so a worker that stops reading,
or sends a byte at a time, fails the schedule instead of stalling the grader; the sandboxed
worker waits as long as the judge does. It imports nothing but the standard library: the
sandbox sees it beside ``wire.py``. Hand-written for the reason ``wire`` is.
"""

from __future__ import annotations

import json
import os
import select

LIMIT = 8 << 20  # the longest message either side accepts, in bytes
_ON = {False: lambda fd: ([fd], [], []), True: lambda fd: ([], [fd], [])}  # select's lists


class ChannelClosed(Exception):
    """The other side is gone, or sent what is not a message (``why`` says which)."""


class Channel:
    """Newline-framed JSON over two file descriptors. Given a clock's ``now``, a ``timeout``
    bounds a whole send or receive (a side that reads or writes a byte at a time included)."""

    def __init__(self, rfd: int, wfd: int, now=None) -> None:
        self.rfd, self.wfd, self.buffer, self.now = rfd, wfd, b"", now

    def _wait(self, fd: int, end: float | None, timeout: float, write: bool = False) -> None:
        """Wait until ``fd`` can be read (``write``: written) without blocking, or TimeoutError
        at ``end`` (None: no wait at all; the sandboxed worker's side blocks in the call)."""
        left = None if end is None else end - self.now()
        if left is not None and (left <= 0 or not any(select.select(*_ON[write](fd), left))):
            raise TimeoutError(f"no {'reading' if write else 'answer'} within {timeout:g} s")

    def send(self, message: dict, timeout: float | None = None) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        end = None if timeout is None else self.now() + timeout
        view = memoryview(data)
        while view:  # with a deadline, no more than a pipe takes at once once it is writable
            self._wait(self.wfd, end, timeout, write=True)
            view = view[os.write(self.wfd, view if end is None else view[: select.PIPE_BUF]) :]

    def recv(self, timeout: float | None = None) -> dict:
        end = None if timeout is None else self.now() + timeout
        while b"\n" not in self.buffer:
            if len(self.buffer) > LIMIT:
                raise ChannelClosed(f"a message over {LIMIT} bytes")
            self._wait(self.rfd, end, timeout)
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:
                raise ChannelClosed("the other side closed the channel")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            raise ChannelClosed("a message that is not JSON") from None
        if not isinstance(message, dict):
            raise ChannelClosed("a message that is not an object")
        return message
