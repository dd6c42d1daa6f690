"""The package's jupyter_server config enables :mod:`attn_helpers.labserver` (the kernel websocket
without Nagle's delay) in every ``jupyter lab`` of the environment, unless told otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from attn_helpers import labserver

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "jupyter-config/jupyter_server_config.d/attn_helpers.json"
PLAIN = "jupyter_server.services.kernels.connection.channels.ZMQChannelsWebsocketConnection"


def test_the_config_file_enables_the_extension_and_is_installed():
    config = json.loads((ROOT / CONFIG).read_text())
    assert config == {"ServerApp": {"jpserver_extensions": {"attn_helpers.labserver": True}}}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["data-files"] == {
        "etc/jupyter/jupyter_server_config.d": [CONFIG]}
    installed = Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.d" / "attn_helpers.json"
    assert installed.exists(), f"{installed} is missing: reinstall with pip install -e ."
    assert json.loads(installed.read_text()) == config
    assert labserver._jupyter_server_extension_points() == [{"module": "attn_helpers.labserver"}]


def _websocket_class(tmp_path: Path, *argv: str) -> str:
    """The kernel websocket class of a server initialised from this environment (not listening)."""
    code = ("import sys\nfrom jupyter_server.serverapp import ServerApp\napp = ServerApp()\n"
            "app.initialize(argv=sys.argv[1:], new_httpserver=False)\n"
            "c = app.web_app.settings['kernel_websocket_connection_class']\n"
            "print('CLASS', c.__module__ + '.' + c.__name__)\n")
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    done = subprocess.run([sys.executable, "-c", code, f"--ServerApp.root_dir={tmp_path}", *argv],
                          capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("CLASS"))


@pytest.mark.slow
def test_a_plain_server_uses_the_no_delay_websocket(tmp_path):
    assert _websocket_class(tmp_path) == "attn_helpers.labserver.NoDelayChannels"


def test_a_websocket_class_chosen_on_the_command_line_is_kept():
    """What ``--ServerApp.kernel_websocket_connection_class=...`` leaves in the server's config and
    settings (initialising a real server takes 17 s, so the other path alone runs one)."""
    from types import SimpleNamespace

    from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
    from traitlets.config import Config

    class Chosen(ZMQChannelsWebsocketConnection):
        pass

    log = SimpleNamespace(info=lambda *args: None)
    for config, chosen in ((Config({"ServerApp": {labserver.SETTING: PLAIN}}),
                            ZMQChannelsWebsocketConnection), (Config(), Chosen)):
        app = SimpleNamespace(config=config, log=log,
                              web_app=SimpleNamespace(settings={labserver.SETTING: chosen}))
        labserver._load_jupyter_server_extension(app)
        assert app.web_app.settings[labserver.SETTING] is chosen
    app = SimpleNamespace(config=Config(), log=log, web_app=SimpleNamespace(
        settings={labserver.SETTING: ZMQChannelsWebsocketConnection}))
    labserver._load_jupyter_server_extension(app)
    assert app.web_app.settings[labserver.SETTING] is labserver.NoDelayChannels
