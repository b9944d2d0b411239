"""A notebook run in a real kernel through nbclient, without nbclient's lost wake-up.

nbclient waits for a cell's reply in one poll of the shell socket, for up to the whole cell
timeout. Meanwhile an ipywidgets Output widget's ``clear_output`` (``interact`` makes one) has
nbclient send a comm message on that same socket, and the reply's wake-up can be lost: the cell
then ends at its timeout, without an error (nbclient issue 312; its fix, PR 311, is not merged).
Lesson 07's ``interact`` cell waited out its 120 s in CI, and in 7 of 36 runs under load here. So
the shell socket is read in slices: a lost wake-up costs a slice, never the timeout.
"""

from __future__ import annotations

import time
from queue import Empty

from nbclient import NotebookClient

SLICE = 0.25  # seconds of one poll of the shell socket


class Client(NotebookClient):
    """:class:`nbclient.NotebookClient`, its shell channel read :data:`SLICE` at a time."""

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        get = kc.shell_channel.get_msg

        async def sliced(timeout: float | None = None):
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = SLICE if deadline is None else max(0.0, min(SLICE, deadline - time.monotonic()))
                try:
                    return await get(timeout=left)
                except Empty:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise

        kc.shell_channel.get_msg = sliced
        return kc
