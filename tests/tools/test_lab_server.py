"""The browser benchmark's JupyterLab server: a port taken between choosing and binding it (another
program on a shared CI machine) costs one retry, not the run."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from attn_helpers.bench import lab


@pytest.mark.slow  # starts a real JupyterLab (~15 s)
def test_a_taken_port_is_retried_with_another(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = iter([busy])
        real = lab._free_port
        monkeypatch.setattr(lab, "_free_port", lambda: next(ports, None) or real())
        log = tmp_path / "jupyterlab.log"
        with lab.lab_server(tmp_path / "notebooks", log) as (base, token):
            assert base != f"http://127.0.0.1:{busy}"
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=10) as reply:
                assert reply.status == 200
    assert "already in use" in log.read_text()
