"""JupyterLab's kernel websocket with ``TCP_NODELAY`` (Nagle's algorithm held a slider move's small
replies back: ``bench browser``'s floor 65 ms without, 33 ms with); enabled by the package's
``jupyter_server_config.d/attn_helpers.json`` unless another class was chosen."""

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
    """Make :class:`NoDelayChannels` the kernel websocket class, unless another one was chosen."""
    settings = serverapp.web_app.settings
    if (SETTING in serverapp.config.get("ServerApp", {})
            or settings.get(SETTING) is not ZMQChannelsWebsocketConnection):
        serverapp.log.info("attn_helpers.labserver: kernel websocket class left as configured (%s)",
                           getattr(settings.get(SETTING), "__name__", None))
        return
    settings[SETTING] = NoDelayChannels
    serverapp.log.info("attn_helpers.labserver: kernel websocket without Nagle's delay")
