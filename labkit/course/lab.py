"""The JupyterLab server's kernel websocket, sent without delay (``make lab`` and the browser test).

jupyter_server leaves Nagle's algorithm on for a kernel's websocket (tornado's default): a small
message written while an earlier one is unacknowledged waits for the browser's delayed ACK, up
to 40 ms on Linux. A slider press sends two or three small messages before its picture, so every
other press waited about 35 ms of its 60 (`benchmarks/slider_browser.py`). No setting of
jupyter_server or tornado turns it off; tornado's own answer is ``set_nodelay``, called here.
"""

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

__all__ = ["Connection"]


class Connection(ZMQChannelsWebsocketConnection):
    """A kernel websocket connection with TCP_NODELAY on its socket."""

    def connect(self):
        self.websocket_handler.set_nodelay(True)
        return super().connect()
