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
    rows = [{"name": "python", "installed": platform.python_version(), "pinned": None}]
    for name in PACKAGES:
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "missing"
        rows.append({"name": name, "installed": installed, "pinned": pins.get(name)})
    for row in rows:
        name, release = row["name"], _release(row["installed"])
        if row["installed"] == "missing":
            row["status"] = "optional" if name == "jupyterlab" else "missing"
        elif release < MINIMUM.get(name, ()):
            row["status"] = "too old"
        else:
            row["status"] = "different" if row["pinned"] and release != _release(row["pinned"]) else "ok"
        if row["status"] == "different":
            warnings.warn(f"{name} {row['installed']} is installed; the course was tested with "
                          f"{row['pinned']} (requirements.txt). It should run, but stored outputs "
                          "may differ in the last digits.", stacklevel=2)
        elif row["status"] == "optional":
            warnings.warn(f"{name} is not installed. The notebooks run in any Jupyter front end "
                          "with ipywidgets 8; install it for JupyterLab.", stacklevel=2)
    broken = [row for row in rows if row["status"] in ("too old", "missing")]
    if broken:
        raise RuntimeError("the course needs " + ", ".join(
            f"{row['name']} >= {'.'.join(map(str, MINIMUM[row['name']]))} (found {row['installed']})"
            if row["name"] in MINIMUM else f"{row['name']} (missing)" for row in broken)
            + ": install requirements.txt (see the README)")
    return rows
