"""Notebook 00's environment check: installed versions against ``requirements.txt``."""

from __future__ import annotations

import platform
import re
import warnings
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "numpy", "matplotlib", "ipywidgets", "jupyterlab")    # jupyterlab: optional
#: Below these the course does not run (``pyproject.toml``'s floors).
MINIMUM = {"python": (3, 11), "torch": (2, 5), "numpy": (1, 26), "matplotlib": (3, 8),
           "ipywidgets": (8, 1)}
REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements.txt"


def _release(version: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``; ``()`` for none."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def check_environment(path: Path | str = REQUIREMENTS) -> list[dict]:
    """One row per package (and Python): ``name``, ``installed``, ``pinned`` and ``status``: "ok",
    "different" or "optional" (a warning), "too old" or "missing" (a ``RuntimeError``)."""
    path, pins = Path(path), {}
    if not path.exists():       # e.g. a non-editable ``pip install .`` ships no requirements.txt
        warnings.warn(f"no {path.name} at {path}: only the minimum versions were checked, not the "
                      "versions the course was tested with.", stacklevel=2)
    for line in path.read_text().splitlines() if path.exists() else []:
        name, pinned, version = line.split("#")[0].partition("==")
        if pinned:
            pins[name.strip().lower()] = version.strip()
    rows = []
    for name in ("python", *PACKAGES):
        try:
            installed = platform.python_version() if name == "python" else metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "missing"
        pinned, release = pins.get(name), _release(installed)
        if installed == "missing":
            status = "optional" if name == "jupyterlab" else "missing"
        elif release < MINIMUM.get(name, ()):
            status = "too old"
        else:
            status = "different" if pinned and release != _release(pinned) else "ok"
        rows.append({"name": name, "installed": installed, "pinned": pinned, "status": status})
        if status == "different":
            warnings.warn(f"{name} {installed} is installed; the course was tested with {pinned} "
                          "(requirements.txt). It should run, but stored outputs may differ in the "
                          "last digits.", stacklevel=2)
        elif status == "optional":
            warnings.warn(f"{name} is not installed. The notebooks run in any Jupyter front end "
                          "with ipywidgets 8; install it for JupyterLab.", stacklevel=2)
    broken = [row for row in rows if row["status"] in ("too old", "missing")]
    if broken:
        raise RuntimeError("the course needs " + ", ".join(
            f"{row['name']} >= {'.'.join(map(str, MINIMUM[row['name']]))} (found {row['installed']})"
            if row["name"] in MINIMUM else f"{row['name']} (missing)" for row in broken)
            + ": install requirements.txt (see the README)")
    return rows
