"""Server-side setting for JupyterLab: the kernel websocket with ``TCP_NODELAY``.

A slider move's reply is a few small messages and the picture. jupyter_server (2.21) and tornado
(6.6) leave Nagle's algorithm on for that websocket, so the server holds small replies back until
the browser acknowledges the first, which it delays: ``bench browser``'s floor (a bare slider
swapping PNGs) took a median of about 65 ms without this class and 33 ms with it (same machine,
same hour). The package installs ``etc/jupyter/jupyter_server_config.d/attn_helpers.json``, which
enables this module as a server extension in every ``jupyter lab`` of the environment, unless
``ServerApp.kernel_websocket_connection_class`` was set explicitly or a gateway is in use.
"""

from __future__ import annotations

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

__all__ = ["NoDelayChannels"]

SETTING = "kernel_websocket_connection_class"


class NoDelayChannels(ZMQChannelsWebsocketConnection):
    """The kernel websocket, with small messages sent at once (no Nagle delay)."""

    def connect(self):
        self.websocket_handler.set_nodelay(True)
        return super().connect()


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "attn_helpers.labserver"}]


def _load_jupyter_server_extension(serverapp) -> None:
    """Make :class:`NoDelayChannels` the server's kernel websocket class (read by the websocket
    handler on each connection), unless another one was chosen."""
    settings = serverapp.web_app.settings
    chosen = SETTING in serverapp.config.get("ServerApp", {})
    if chosen or settings.get(SETTING) is not ZMQChannelsWebsocketConnection:
        serverapp.log.info("attn_helpers.labserver: kernel websocket class left as configured "
                           "(%s)", getattr(settings.get(SETTING), "__name__", None))
        return
    settings[SETTING] = NoDelayChannels
    serverapp.log.info("attn_helpers.labserver: kernel websocket without Nagle's delay "
                       "(NoDelayChannels)")
