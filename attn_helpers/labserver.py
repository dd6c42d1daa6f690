"""Server-side setting for JupyterLab: the kernel websocket with ``TCP_NODELAY``.

A slider move sends one small message to the kernel, and the kernel answers with a few small
messages and the new picture. jupyter_server (2.21) and tornado (6.6) leave Nagle's algorithm on
for that websocket, so after the first small reply the server holds the next ones back until the
browser acknowledges it, and the browser delays its acknowledgement: measured here, the picture
reached the page about 48 ms after the key press instead of about 17 ms (plain ipywidgets slider
and image: 57 ms against 26 ms end to end). ``python3 course.py lab`` and ``python -m attn_helpers
bench browser`` start JupyterLab with::

    --ServerApp.kernel_websocket_connection_class=attn_helpers.labserver.NoDelayChannels

It runs in the Jupyter server process only; nothing in the package imports it.
"""

from __future__ import annotations

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

__all__ = ["NoDelayChannels", "SERVER_FLAG"]

SERVER_FLAG = ("--ServerApp.kernel_websocket_connection_class="
               "attn_helpers.labserver.NoDelayChannels")


class NoDelayChannels(ZMQChannelsWebsocketConnection):
    """The kernel websocket, with small messages sent at once (no Nagle delay)."""

    def connect(self):
        self.websocket_handler.set_nodelay(True)
        return super().connect()
