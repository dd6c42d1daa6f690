"""Notebook 00: start here. The environment check: versions against ``requirements.txt``, a
warning for a different version, an error only for what breaks the course.
"""

from __future__ import annotations

import platform
import re
import warnings
from importlib import metadata
from pathlib import Path

__all__ = ["PACKAGES", "MINIMUM", "pinned_versions", "environment_report", "check_environment"]

#: The distributions the notebooks need, by their name on PyPI.
PACKAGES = ("torch", "numpy", "matplotlib", "ipywidgets", "jupyterlab")
#: Front ends the notebooks can do without (any Jupyter client with ipywidgets 8 runs them):
#: missing, they get a warning, not an error.
OPTIONAL = ("jupyterlab",)
#: Below these versions the course does not run (``pyproject.toml``'s ranges; ipywidgets 8 is
#: the widget protocol the notebooks' widgets speak). Any other difference only gets a warning.
MINIMUM = {"python": (3, 11), "torch": (2, 3), "numpy": (1, 26), "matplotlib": (3, 8),
           "ipywidgets": (8, 1)}
REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements.txt"


def _release(version: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``: the leading numeric part of a version string."""
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.end() < len(part):         # "0rc1": the release ends here
            break
    return tuple(numbers)


def pinned_versions(path: Path | str = REQUIREMENTS) -> dict[str, str]:
    """``{name: version}`` of the ``name==version`` lines of a requirements file; ``{}`` if the
    file is not there (an installed package without the repository)."""
    path = Path(path)
    if not path.exists():
        return {}
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def environment_report(path: Path | str = REQUIREMENTS) -> list[dict]:
    """One row per package (and Python): ``name``, ``installed``, ``pinned`` (or ``None``) and
    ``status``: ``"ok"``, ``"different"`` (runs, but stored outputs may differ in the last
    digits), ``"optional"`` (an :data:`OPTIONAL` front end that is not installed) or
    ``"too old"``/``"missing"`` (the course will not run)."""
    pins = pinned_versions(path)
    rows = [{"name": "python", "installed": platform.python_version(), "pinned": None}]
    for name in PACKAGES:
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "missing"
        rows.append({"name": name, "installed": installed, "pinned": pins.get(name)})
    for row in rows:
        release = _release(row["installed"])
        if row["installed"] == "missing" and row["name"] in OPTIONAL:
            row["status"] = "optional"
        elif row["installed"] == "missing" or release < MINIMUM.get(row["name"], ()):
            row["status"] = "too old" if row["installed"] != "missing" else "missing"
        elif row["pinned"] and release != _release(row["pinned"]):
            row["status"] = "different"
        else:
            row["status"] = "ok"
    return rows


def check_environment(path: Path | str = REQUIREMENTS) -> list[dict]:
    """Print nothing; warn for each package whose version differs from the pinned one (or that
    is an optional front end and missing), and raise
    ``RuntimeError`` naming every package that is missing or too old. Returns the report."""
    rows = environment_report(path)
    for row in rows:
        if row["status"] == "different":
            warnings.warn(f"{row['name']} {row['installed']} is installed; the course was tested "
                          f"with {row['pinned']} (requirements.txt). It should run, but stored "
                          "outputs may differ in the last digits.", stacklevel=2)
        elif row["status"] == "optional":
            warnings.warn(f"{row['name']} is not installed. The notebooks run in any Jupyter "
                          "front end with ipywidgets 8; install it for JupyterLab.", stacklevel=2)
    broken = [row for row in rows if row["status"] in ("too old", "missing")]
    if broken:
        raise RuntimeError("the course needs " + ", ".join(
            f"{row['name']} >= {'.'.join(map(str, MINIMUM[row['name']]))} (found "
            f"{row['installed']})" if row["name"] in MINIMUM else f"{row['name']} (missing)"
            for row in broken) + ": install requirements.txt (see the README)")
    return rows
