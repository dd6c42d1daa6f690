#!/usr/bin/env python3
"""The course's two commands (see README.md).

    python3 course.py lab     set everything up (first time only) and open JupyterLab on the course
    python3 course.py test    set everything up and run the whole test suite, exactly as CI does
    python3 course.py progress [--reset]   which exercises you have passed, across all notebooks

For contributors, the quick loop while you work (lint, import tiers, unit tests; no browser, no
slow re-training, no nbval):

    python3 course.py test --fast

For instructors, after editing a notebook or a helper it uses:

    python3 course.py execute [notebooks/NN_name.ipynb ...]   re-run notebooks in a fresh kernel
                                                              and store their outputs (default: all)

Setting up means: a virtual environment in ``.venv`` with the exact versions from
``requirements.txt`` (the helper package ``attn_helpers`` included, editable). It is reinstalled
only when ``requirements.txt`` or ``pyproject.toml`` change. Needs Python 3.11 or newer and
nothing else.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".course-installed"
NOTEBOOKS = ROOT / "notebooks"
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def say(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def run(args: list, env: dict | None = None) -> None:
    """Run a command from the repository root; stop the whole script if it fails."""
    result = subprocess.run([str(a) for a in args], cwd=ROOT, env=env)
    if result.returncode != 0:
        print(f"\ncourse.py: step failed (exit {result.returncode}): {' '.join(map(str, args))}",
              file=sys.stderr)
        sys.exit(result.returncode)


def install_fingerprint() -> str:
    digest = hashlib.sha256()
    for name in ("requirements.txt", "pyproject.toml"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def setup() -> None:
    """Create ``.venv`` and install the pinned requirements, unless already up to date."""
    if sys.version_info < (3, 11):  # noqa: UP036 (this script may be started by an old Python)
        sys.exit(f"course.py: Python 3.11 or newer is needed, this is {sys.version.split()[0]}")
    if not PYTHON.exists():
        say(f"creating the virtual environment {VENV.relative_to(ROOT)}")
        run([sys.executable, "-m", "venv", VENV])
    fingerprint = install_fingerprint()
    if STAMP.exists() and STAMP.read_text() == fingerprint:
        return
    say("installing the pinned requirements (first time: a few minutes)")
    run([PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "-r", "requirements.txt"])
    STAMP.write_text(fingerprint)


def lab(extra: list[str]) -> None:
    setup()
    say("opening JupyterLab on the course (stop it with Ctrl+C)")
    # Kernel messages without Nagle's delay: about 30 ms less from a slider move to its picture
    # (see attn_helpers/labserver.py).
    run([BIN / "jupyter", "lab", f"--ServerApp.root_dir={NOTEBOOKS}",
         "--ServerApp.kernel_websocket_connection_class=attn_helpers.labserver.NoDelayChannels",
         *extra])


def nbval_command() -> list:
    """Strict nbval on every notebook: stored outputs must match a fresh run exactly
    (after the sanitize file's substitutions)."""
    return [PYTHON, "-m", "pytest", "--nbval", "--nbval-current-env",
            "--nbval-sanitize-with", SANITIZE, "--nbval-cell-timeout=600", "-p", "no:cacheprovider",
            NOTEBOOKS]


def test(extra: list[str]) -> None:
    setup()
    fast = "--fast" in extra
    extra = [a for a in extra if a != "--fast"]
    started = time.monotonic()
    say("lint: ruff on the package, the tests and the notebooks")
    run([PYTHON, "-m", "ruff", "check", "attn_helpers", "tests", "notebooks", "course.py"])
    say("import tiers: lint-imports (contracts in pyproject.toml)")
    run([BIN / "lint-imports", "--no-cache"])
    if fast:
        say("fast loop: unit, property, widget and hygiene tests (no browser, no slow, no nbval)")
        run([PYTHON, "-m", "pytest", "tests", "-p", "no:cacheprovider", "-q",
             "-m", "not slow and not browser", *extra])
        say(f"fast checks passed in {time.monotonic() - started:.0f} s")
        return
    say("unit, property, widget, re-training, notebook-hygiene and browser tests")
    run([PYTHON, "-m", "pytest", "tests", "-p", "no:cacheprovider", *extra])
    say("speed: a slider move in the kernel, and key press to picture in JupyterLab (Chromium)")
    # Numbers are printed; a shared, noisy machine fails only at twice a target (README).
    run([PYTHON, "-m", "attn_helpers", "bench", "widget", "--repeats", "20"])
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    if Path(chromium).exists() or os.environ.get("CI") == "true":
        run([PYTHON, "-m", "attn_helpers", "bench", "browser", "--check", "--fail-above", "100"])
    else:
        say(f"no Chromium at {chromium}: the end-to-end widget benchmark is skipped (see README)")
    single = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    say("notebooks, strict nbval, one thread (OMP_NUM_THREADS=1)")
    run(nbval_command(), env=single)
    default = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    say(f"notebooks, strict nbval, default thread count ({os.cpu_count()} cores)")
    run(nbval_command(), env=default)
    say(f"all checks passed in {time.monotonic() - started:.0f} s")


def execute(paths: list[str]) -> None:
    setup()
    notebooks = [Path(p).resolve() for p in paths] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for notebook in notebooks:
        say(f"executing {notebook.relative_to(ROOT)} top to bottom in a fresh kernel")
        # No widget state in the stored file: exported HTML, GitHub and nbviewer then show each
        # widget's static picture (its image/png) instead of an embed that needs a kernel.
        # A fresh progress file: the stored outputs never show the instructor's own passes.
        with tempfile.TemporaryDirectory() as progress_dir:
            run([BIN / "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
                 "--ExecutePreprocessor.timeout=600",
                 "--ExecutePreprocessor.store_widget_state=False", notebook],
                env=dict(os.environ, ATTN_COURSE_PROGRESS_DIR=progress_dir))


def progress(extra: list[str]) -> None:
    setup()
    run([PYTHON, "-m", "attn_helpers", "progress", *extra])


def main(argv: list[str]) -> None:
    commands = {"lab": lab, "test": test, "execute": execute, "progress": progress}
    if not argv or argv[0] not in commands:
        print(__doc__)
        sys.exit(2)
    commands[argv[0]](argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
