"""Plumbing of ``bench browser``: JupyterLab on loopback over a copy of the notebooks, Debian's
Chromium through Playwright, and the page helpers (Run All, the kernel's state, a key press timed
to the new picture).

The server is started as a learner's plain ``jupyter lab`` is: it reads the package's
``jupyter_server_config.d/attn_helpers.json`` from the environment (the kernel websocket without
Nagle's delay, :mod:`attn_helpers.labserver`); ``lab_args`` adds or overrides settings.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

__all__ = ["CHROMIUM", "FLOOR_NOTEBOOK", "chromium", "lab_server", "open_notebook", "open_lab",
           "lab_ready", "open_in_lab", "close_notebooks", "run_all", "error_outputs",
           "shut_down_kernels", "watch_picture", "timed_key", "wait"]

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync",
                  "--disable-quic"]
FLOOR_NOTEBOOK = "_floor.ipynb"

# The floor: a bare ipywidgets slider that swaps precomputed PNGs (heatmaps the size of a
# notebook widget's picture) in an ipywidgets.Image. What any widget costs on this machine.
FLOOR_SOURCE = """\
import io
import ipywidgets as widgets
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

frames = []
for i in range(16):
    fig = Figure(figsize=(9.6, 5.4), dpi=80)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.imshow(np.random.default_rng(i).random((24, 24)), vmin=0, vmax=1, cmap="viridis")
    ax.set_title(f"frame {i}")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    frames.append(buffer.getvalue())
slider = widgets.IntSlider(0, min=0, max=len(frames) - 1, description="frame")
image = widgets.Image(value=frames[0], format="png")
slider.observe(lambda change: setattr(image, "value", frames[change["new"]]), names="value")
widgets.VBox([slider, image])
"""

# In the page, for every widget picture: when its ``src`` is swapped (the kernel's PNG arrived),
# when the new picture is decoded (``img.decode()``: the next frame can show it) and the first
# animation frame after that (on screen), each as milliseconds after the last key press
# (``keydown``'s time stamp; same clock as ``performance.now()``). A waiting ``timed_key`` gets
# the three at the frame. Event driven: nothing polls, so the page draws no frame for the waiting.
PROBE = """
(img) => {
  const a = window.__attn = window.__attn || {key: 0, waiter: null};
  if (!window.__attnKeys) {
    window.__attnKeys = true;
    document.addEventListener('keydown', e => { a.key = e.timeStamp; }, true);
  }
  if (img.__attnObserved) return;
  img.__attnObserved = true;
  new MutationObserver(() => {
    const key = a.key, swapped = performance.now();
    img.decode().catch(() => null).then(() => {
      const decoded = performance.now();
      requestAnimationFrame(() => {
        const shown = performance.now(), waiter = a.waiter;
        if (waiter && key === a.key) {
          a.waiter = null;
          waiter({swapped: swapped - key, decoded: decoded - key, shown: shown - key});
        }
      });
    });
  }).observe(img, {attributes: true, attributeFilter: ['src']});
}
"""

# Arm the waiter before a key press; then wait for it, or for ``timeout`` ms (``null``).
_ARM = "() => { const a = window.__attn; a.next = new Promise(r => { a.waiter = r; }); }"
_AWAIT = ("t => Promise.race([window.__attn.next, "
          "new Promise(r => setTimeout(() => { window.__attn.waiter = null; r(null); }, t))])")


def _floor_notebook() -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "id": "floor", "metadata": {},
                       "outputs": [], "source": FLOOR_SOURCE}],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                        "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


PORT_ATTEMPTS = 3  # lab_server: ports tried before giving up


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _responds(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def lab_server(notebooks_dir: Path, log_path: Path, lab_args: tuple[str, ...] = ()):
    """JupyterLab over a copy of ``notebooks_dir`` (plus the floor notebook) on 127.0.0.1, a free
    port and a random token: yields ``(base_url, token)``."""
    with tempfile.TemporaryDirectory() as home:
        home = Path(home)
        shutil.copytree(notebooks_dir, home / "notebooks")
        (home / "notebooks" / FLOOR_NOTEBOOK).write_text(json.dumps(_floor_notebook()))
        settings = home / "settings" / "@jupyterlab"
        for extension, name, value in (
                ("apputils-extension", "notification", {"fetchNews": "false",
                                                        "checkForUpdates": False}),
                # JupyterLab 4's default, as a learner meets it: every cell in the page (every
                # prompt and output readable), off-screen ones skipped by layout and paint
                ("notebook-extension", "tracker", {"windowingMode": "contentVisibility"})):
            (settings / extension).mkdir(parents=True)
            (settings / extension / f"{name}.jupyterlab-settings").write_text(json.dumps(value))
        token = secrets.token_hex(16)
        env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
                   JUPYTER_RUNTIME_DIR=str(home / "runtime"))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:
            # a free port can be taken by another program before the server binds it; the server
            # then exits at once (port_retries=0 keeps the URL known), and a new port is tried
            for attempt in range(1, PORT_ATTEMPTS + 1):
                port = _free_port()
                server = subprocess.Popen(
                    [sys.executable, "-m", "jupyter", "lab", "--no-browser",
                     "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                     "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
                     f"--ServerApp.root_dir={home / 'notebooks'}", "--ServerApp.allow_root=True",
                     # window.jupyterapp: notebooks opened and closed in one page (open_in_lab)
                     "--LabApp.expose_app_in_browser=True", *lab_args],
                    stdout=log, stderr=subprocess.STDOUT, env=env, cwd=home / "notebooks")
                base = f"http://127.0.0.1:{port}"
                if _wait_until_up(server, f"{base}/api/status?token={token}"):
                    break
                if attempt == PORT_ATTEMPTS:
                    raise RuntimeError(f"JupyterLab did not start ({PORT_ATTEMPTS} ports tried); "
                                       f"see {log_path}")
            try:
                yield base, token
            finally:
                server.terminate()
                try:
                    server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    server.kill()


def _wait_until_up(server: subprocess.Popen, status_url: str, timeout_s: float = 90.0) -> bool:
    """True once the server answers; False if it exited first (its port was taken); raises if it
    neither answers nor exits within ``timeout_s`` (after stopping it)."""
    deadline = time.monotonic() + timeout_s
    while not _responds(status_url):
        if server.poll() is not None:
            return False
        if time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"JupyterLab did not answer {status_url} within {timeout_s:.0f} s")
        time.sleep(0.5)
    return True


@contextmanager
def chromium():
    """Headless Chromium (Debian's, not Playwright's download) through Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def wait(condition, timeout_s: float, what: str, interval_s: float = 0.25):
    """Poll ``condition()`` until it is truthy (returned) or raise ``TimeoutError``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _idle(page) -> bool:
    return "| Idle" in page.locator("#jp-main-statusbar").inner_text()


def _prompts(page) -> list[str]:
    """The input prompts of the code cells: '[ ]:' not run, '[*]:' running, '[3]:' done (cells
    with a hidden source show none)."""
    return [t.strip() for t in page.locator(".jp-CodeCell .jp-InputPrompt").all_text_contents()
            if t.strip()]


def open_notebook(page, base: str, token: str, name: str) -> None:
    """Open ``name`` in a workspace of its own (reset: only this notebook is open)."""
    page.goto(f"{base}/lab/workspaces/{Path(name).stem}/tree/{name}?token={token}&reset")
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=60_000)
    wait(lambda: _idle(page), 60, "the kernel to start")


def open_lab(page, base: str, token: str, wait: bool = True) -> None:
    """JupyterLab in ``page`` with an empty workspace, for :func:`open_in_lab`; with ``wait``
    False, only started (it loads while the caller goes on; :func:`lab_ready` waits for it)."""
    page.goto(f"{base}/lab/workspaces/browser-pass?token={token}&reset", wait_until="commit")
    if wait:
        lab_ready(page)


def lab_ready(page) -> None:
    """Wait until the JupyterLab in ``page`` has started and restored its workspace."""
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=60_000)
    page.evaluate("() => jupyterapp.started.then(() => jupyterapp.restored).then(() => null)")


def open_in_lab(page, name: str) -> None:
    """Open ``name`` in the JupyterLab of ``page`` (:func:`open_lab`), as a learner opens the
    next notebook from the file browser: the app is not loaded again."""
    page.evaluate("path => { jupyterapp.commands.execute('docmanager:open', "
                  "{path, factory: 'Notebook'}); }", name)
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=60_000)
    wait(lambda: _idle(page), 60, "the kernel to start", interval_s=0.1)


def close_notebooks(page) -> None:
    """Close every notebook of the JupyterLab in ``page`` without saving (no dialog)."""
    page.evaluate("""() => {
      for (const widget of Array.from(jupyterapp.shell.widgets('main'))) {
        if (widget.context) { widget.context.model.dirty = false; }
        widget.close();
      }
    }""")
    page.locator(".jp-NotebookPanel").first.wait_for(state="detached", timeout=30_000)


def run_all(page, timeout_s: float) -> tuple[float, list[str]]:
    """*Run > Run All Cells*, then wait until the kernel is idle with no cell queued or running
    (every cell ran, or a cell's error stopped the run). Returns the seconds it took and the
    prompts of the cells that did not run."""
    started = time.monotonic()
    for _attempt in range(3):  # a click before the kernel is connected can be lost
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
        try:
            wait(lambda: any(p != "[ ]:" for p in _prompts(page)), 20, "Run All to start")
            break
        except TimeoutError:
            continue
    quiet = [0]

    def finished() -> bool:   # idle, nothing queued or running, on three polls in a row
        quiet[0] = quiet[0] + 1 if _idle(page) and "[*]:" not in _prompts(page) else 0
        return quiet[0] >= 3

    wait(finished, timeout_s, "Run All to finish", interval_s=0.2)
    return (time.monotonic() - started,
            [p for p in _prompts(page) if not re.fullmatch(r"\[\d+\]:", p)])


def error_outputs(page) -> list[str]:
    """The texts of error outputs (a traceback, or stderr naming an error) in the page."""
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    return [t for t in errors.all_text_contents() if "Error" in t or "Traceback" in t]


def shut_down_kernels(base: str, token: str, keep: str | None = None,
                      background: bool = False) -> threading.Thread | None:
    """Stop every kernel of the server (but the session of the notebook ``keep``), so that
    notebooks do not compete for the CPU. A kernel takes seconds to exit, mostly waiting: with
    ``background`` the requests run in a thread (returned, to join) while the pass goes on."""
    with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=10) as response:
        sessions = [s for s in json.load(response)
                    if keep is None or Path(s.get("path", "")).name != keep]

    def delete() -> None:
        for session in sessions:
            request = urllib.request.Request(
                f"{base}/api/sessions/{session['id']}?token={token}", method="DELETE")
            try:
                urllib.request.urlopen(request, timeout=20).close()
            except urllib.error.HTTPError as error:
                if error.code != 404:     # 404: already gone
                    raise

    if not background:
        delete()
        return None
    thread = threading.Thread(target=delete, name="shut-down-kernels", daemon=True)
    thread.start()
    return thread


def watch_picture(image) -> None:
    """Install the probe on a widget's ``<img>``: key presses and new pictures are time-stamped."""
    image.evaluate(PROBE)


def timed_key(page, key: str, timeout_ms: int = 3000) -> dict | None:
    """Press ``key``; ``{"swapped", "decoded", "shown"}``: milliseconds from the key press to the
    new picture's ``src`` swap, to the picture decoded, and to the first animation frame after
    that; ``None`` when no picture came within ``timeout_ms`` (an inert move: a slider at its
    end, a control that changes nothing). Returns once the picture is on screen, so the next key
    never queues behind it."""
    page.evaluate(_ARM)
    page.keyboard.press(key)
    return page.evaluate(_AWAIT, timeout_ms)
