"""Server-side setting for JupyterLab: the kernel websocket with ``TCP_NODELAY``.

A slider move sends one small message to the kernel, and the kernel answers with a few small
messages and the new picture. jupyter_server (2.21) and tornado (6.6) leave Nagle's algorithm on
for that websocket, so after the first small reply the server holds the next ones back until the
browser acknowledges it, and the browser delays its acknowledgement. Measured with ``python -m
attn_helpers bench browser``'s floor (a bare ipywidgets slider swapping precomputed PNGs, key
press to picture): a median of about 33 ms with this class against about 65 ms without, on the
same 2-core machine in the same hour.

Every ``jupyter lab`` (or ``jupyter server``) started from an environment where the package is
installed uses it: the package installs ``etc/jupyter/jupyter_server_config.d/attn_helpers.json``
(pyproject.toml, ``[tool.setuptools.data-files]``), which enables this module as a server
extension, and :func:`_load_jupyter_server_extension` makes :class:`NoDelayChannels` the kernel
websocket class, unless ``ServerApp.kernel_websocket_connection_class`` was set explicitly (on the
command line or in a config file) or a gateway is in use. ``python3 course.py lab`` also sets it
explicitly with :data:`SERVER_FLAG`.

It runs in the Jupyter server process only; nothing in the package imports it.
"""

from __future__ import annotations

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

__all__ = ["NoDelayChannels", "SERVER_FLAG"]

SERVER_FLAG = ("--ServerApp.kernel_websocket_connection_class="
               "attn_helpers.labserver.NoDelayChannels")
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
