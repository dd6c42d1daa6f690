"""``python -m attn_helpers bench browser [notebooks...] [--check]``: a slider move end to end.

What a learner feels: JupyterLab on loopback (a free port, a random token, a copy of the
notebooks), Debian's Chromium driven by Playwright, *Run All*, then every slider of every live
widget moved with the arrow keys. One move is timed in the page, from the key press (the
``keydown`` event's time stamp) to the widget's new picture decoded and painted (a
``MutationObserver`` on the ``<img>``'s ``src``, then ``img.decode()`` and the next animation
frame). The next key is pressed only once the picture of the last one is on screen, so moves
never queue.

Prints one JSON record per notebook, ``{"notebook", "moves", "median_ms", "p90_ms"}``, and the
verdict on stderr; with ``--check`` exits 1 when a median exceeds :data:`BROWSER_TARGET_MS`.
Needs Chromium at ``/usr/bin/chromium`` (or ``$CHROMIUM``) and Playwright for Python.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from .widget import summarize

# As `python3 course.py lab` starts JupyterLab: the kernel websocket without Nagle's delay (see
# attn_helpers/labserver.py, which runs in the server process and is imported by nothing here).
SERVER_FLAG = ("--ServerApp.kernel_websocket_connection_class="
               "attn_helpers.labserver.NoDelayChannels")

__all__ = ["BROWSER_TARGET_MS", "lab_server", "chromium", "measure_notebook", "main"]

ROOT = Path(__file__).resolve().parents[2]
BROWSER_TARGET_MS = 50.0
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync"]
KEYS_PER_SLIDER = 4

# In the page: time stamp of the last key press, and of the first frame after a widget's
# picture changed (src swapped, new image decoded, next animation frame).
PROBE = """
(img) => {
  window.__attn = window.__attn || {key: 0, shown: 0};
  if (!window.__attnKeys) {
    window.__attnKeys = true;
    document.addEventListener('keydown', e => { window.__attn.key = e.timeStamp; }, true);
  }
  if (img.__attnObserved) return;
  img.__attnObserved = true;
  new MutationObserver(() => {
    img.decode().catch(() => null).then(() => requestAnimationFrame(() => {
      window.__attn.shown = performance.now();
    }));
  }).observe(img, {attributes: true, attributeFilter: ['src']});
}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def lab_server(notebooks_dir: Path, log_path: Path):
    """JupyterLab over a copy of ``notebooks_dir`` on 127.0.0.1: yields ``(base_url, token)``."""
    with tempfile.TemporaryDirectory() as home:
        home = Path(home)
        shutil.copytree(notebooks_dir, home / "notebooks")
        settings = home / "settings" / "@jupyterlab"
        for extension, name, value in (
                ("apputils-extension", "notification", {"fetchNews": "false",
                                                        "checkForUpdates": False}),
                ("notebook-extension", "tracker", {"windowingMode": "none"})):
            (settings / extension).mkdir(parents=True)
            (settings / extension / f"{name}.jupyterlab-settings").write_text(json.dumps(value))
        port, token = _free_port(), secrets.token_hex(16)
        env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
                   JUPYTER_RUNTIME_DIR=str(home / "runtime"))
        with open(log_path, "w") as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "jupyter", "lab", "--no-browser",
                 "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                 "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
                 f"--ServerApp.root_dir={home / 'notebooks'}", "--ServerApp.allow_root=True",
                 SERVER_FLAG],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=home / "notebooks")
            base = f"http://127.0.0.1:{port}"
            try:
                deadline = time.monotonic() + 90
                while not _responds(f"{base}/api/status?token={token}"):
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"JupyterLab did not start; see {log_path}")
                    time.sleep(0.5)
                yield base, token
            finally:
                server.terminate()
                try:
                    server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    server.kill()


def _responds(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


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


def _wait(condition, timeout_s: float, what: str, interval_s: float = 0.25):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _idle(page) -> bool:
    return "| Idle" in page.locator("#jp-main-statusbar").inner_text()


def _run_all(page, timeout_s: float) -> None:
    prompts = page.locator(".jp-CodeCell .jp-InputPrompt")
    for _attempt in range(3):  # a click before the kernel is connected can be lost
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
        try:
            _wait(lambda: any(p.strip() not in ("", "[ ]:")
                              for p in prompts.all_text_contents()), 20, "Run All to start")
            break
        except TimeoutError:
            continue
    _wait(lambda: _idle(page) and all(p.strip() == "" or p.strip()[1:-2].isdigit()
                                      for p in prompts.all_text_contents()),
          timeout_s, "Run All to finish", interval_s=1.0)


def _shut_down_kernels(base: str, token: str) -> None:
    """Stop every kernel of the server, so that notebooks do not compete for the CPU."""
    with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=10) as response:
        sessions = json.load(response)
    for session in sessions:
        request = urllib.request.Request(f"{base}/api/sessions/{session['id']}?token={token}",
                                         method="DELETE")
        urllib.request.urlopen(request, timeout=20).close()


def measure_notebook(browser, base: str, token: str, name: str, *, keys: int = KEYS_PER_SLIDER,
                     run_timeout_s: float = 300) -> list[float]:
    """Milliseconds from key press to new picture, for ``keys`` presses on every slider of every
    widget of notebook ``name`` (after Run All)."""
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    page = context.new_page()
    latencies = []
    try:
        stem = Path(name).stem
        page.goto(f"{base}/lab/workspaces/{stem}/tree/{name}?token={token}&reset")
        page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=60_000)
        _wait(lambda: _idle(page), 60, "the kernel to start")
        _run_all(page, run_timeout_s)
        images = page.locator(".jp-OutputArea-output img.widget-image")
        for w in range(images.count()):
            image = images.nth(w)
            widget = image.locator("xpath=ancestor::div[contains(@class, 'widget-vbox')][1]")
            widget.scroll_into_view_if_needed()
            image.evaluate(PROBE)
            handles = widget.locator(".widget-slider .noUi-handle")
            for h in range(handles.count()):
                handle = handles.nth(h)
                handle.click()
                key = ("ArrowLeft" if handle.get_attribute("aria-valuenow")
                       == handle.get_attribute("aria-valuemax") else "ArrowRight")
                for _ in range(keys):
                    before = page.evaluate("window.__attn.shown")
                    page.keyboard.press(key)
                    try:
                        page.wait_for_function(f"window.__attn.shown > {before}", timeout=3000)
                    except Exception:  # an inert move (a slider at its end, a no-op control)
                        continue
                    latencies.append(page.evaluate("window.__attn.shown - window.__attn.key"))
    finally:
        context.close()
        _shut_down_kernels(base, token)
    return latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers bench browser",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="notebook files or stems (default: all)")
    parser.add_argument("--keys", type=int, default=KEYS_PER_SLIDER,
                        help="arrow-key presses per slider")
    parser.add_argument("--check", action="store_true",
                        help="exit with status 1 when a median exceeds --fail-above")
    parser.add_argument("--fail-above", type=float, default=BROWSER_TARGET_MS, metavar="MS",
                        help=f"the median that fails --check (default: the target, "
                             f"{BROWSER_TARGET_MS} ms; CI uses twice it, since its machine "
                             "is shared and noisy)")
    args = parser.parse_args(argv)
    if not args.fail_above > 0:
        parser.error("--fail-above must be > 0")
    folder = ROOT / "notebooks"
    every = sorted(p.name for p in folder.glob("*.ipynb"))
    chosen = [n for n in every if not args.notebooks
              or any(n == a or Path(n).stem == Path(a).stem or n.startswith(a)
                     for a in args.notebooks)]
    if not chosen:
        parser.error(f"no notebook matches {args.notebooks}; known: {every}")
    if not Path(CHROMIUM).exists():
        parser.error(f"Chromium not found at {CHROMIUM} (Debian's 'chromium', or set $CHROMIUM)")
    records, ok = [], True
    artifacts = ROOT / "artifacts" / "browser"
    artifacts.mkdir(parents=True, exist_ok=True)
    with chromium() as browser, lab_server(folder, artifacts / "bench_lab.log") as (base, token):
        for name in chosen:
            latencies = measure_notebook(browser, base, token, name, keys=args.keys)
            record = {"notebook": Path(name).stem, "moves": len(latencies)}
            record.update(summarize(latencies) if latencies else {"median_ms": None,
                                                                 "p90_ms": None})
            met = bool(latencies) and record["median_ms"] <= BROWSER_TARGET_MS
            ok &= bool(latencies) and record["median_ms"] <= args.fail_above
            records.append(record)
            print(f"{record['notebook']:>24}: {record['moves']:3d} moves, median "
                  f"{record['median_ms']} ms, p90 {record['p90_ms']} ms"
                  f"{'' if met else '  NOT met'}", file=sys.stderr, flush=True)
    print(json.dumps(records, indent=1))
    target_met = all(r["median_ms"] is not None and r["median_ms"] <= BROWSER_TARGET_MS
                     for r in records)
    print(f"target: median <= {BROWSER_TARGET_MS} ms per notebook: "
          f"{'met' if target_met else 'NOT met'}; --check fails above {args.fail_above} ms: "
          f"{'passes' if ok else 'FAILS'}", file=sys.stderr)
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(main())
