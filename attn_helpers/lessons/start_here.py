"""Notebook 00: start here. The environment check (versions against ``requirements.txt``: a
warning for a different version, an error only for what breaks the course) and :func:`claims`,
the statements the notebook makes about its warm-up widget and its exercises.
"""

from __future__ import annotations

import math
import platform
import re
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import torch

from ..entropy import attention_entropy

__all__ = ["PACKAGES", "MINIMUM", "pinned_versions", "environment_report", "check_environment",
           "claims", "ROW", "row_claims"]

#: The distributions the notebooks need, by their name on PyPI.
PACKAGES = ("torch", "numpy", "matplotlib", "ipywidgets", "jupyterlab")
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
    digits) or ``"too old"`` (the course will not run)."""
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
        if row["installed"] == "missing" or release < MINIMUM.get(row["name"], ()):
            row["status"] = "too old" if row["installed"] != "missing" else "missing"
        elif row["pinned"] and release != _release(row["pinned"]):
            row["status"] = "different"
        else:
            row["status"] = "ok"
    return rows


def check_environment(path: Path | str = REQUIREMENTS) -> list[dict]:
    """Print nothing; warn for each package whose version differs from the pinned one, and raise
    ``RuntimeError`` naming every package that is missing or too old. Returns the report."""
    rows = environment_report(path)
    for row in rows:
        if row["status"] == "different":
            warnings.warn(f"{row['name']} {row['installed']} is installed; the course was tested "
                          f"with {row['pinned']} (requirements.txt). It should run, but stored "
                          "outputs may differ in the last digits.", stacklevel=2)
    broken = [row for row in rows if row["status"] in ("too old", "missing")]
    if broken:
        raise RuntimeError("the course needs " + ", ".join(
            f"{row['name']} >= {'.'.join(map(str, MINIMUM[row['name']]))} (found "
            f"{row['installed']})" if row["name"] in MINIMUM else f"{row['name']} (missing)"
            for row in broken) + ": install requirements.txt (see the README)")
    return rows


# --- the claims of notebook 00 ----------------------------------------------------------------

SHARP_T, FLAT_T = 0.1, 10.0
SHARP_BELOW = 0.1        # mean entropy (nats) at T = 0.1
FLAT_ABOVE = 0.95        # mean entropy at T = 10, as a share of ln n


def claims(weights_at: Callable[[float, bool], torch.Tensor], group: str | None = None,
           ) -> dict[str, bool]:
    """Notebook 00's statements about its warm-up, as named booleans. ``weights_at(temperature,
    causal)`` returns the warm-up widget's weights ``(n, n)`` (``warmup_frame(...).weights``).
    Names start with their group (``temperature``, ``causal``, ``entropy``); ``group`` keeps one."""
    every = _claims(weights_at)
    chosen = {k: v for k, v in every.items() if group is None or k.startswith(group)}
    if not chosen:
        raise ValueError(f"no claim of notebook 00 starts with {group!r}")
    return chosen


def _claims(weights_at: Callable[[float, bool], torch.Tensor]) -> dict[str, bool]:
    sharp, flat, masked = weights_at(SHARP_T, False), weights_at(FLAT_T, False), weights_at(1.0, True)
    n = sharp.shape[-1]
    rows_sum_to_one = torch.allclose(masked.sum(-1), torch.ones(n, dtype=masked.dtype))
    one_hot = [attention_entropy(torch.eye(m)[0]).item() for m in (2, 6, 32)]
    uniform = [attention_entropy(torch.full((m,), 1.0 / m)).item() - math.log(m) for m in (2, 6, 32)]
    return {claim: bool(holds) for claim, holds in {
        f"temperature: at T = {SHARP_T} the mean entropy is below {SHARP_BELOW} nats, at "
        f"T = {FLAT_T} above {FLAT_ABOVE} ln n":
            attention_entropy(sharp).mean() < SHARP_BELOW
            and attention_entropy(flat).mean() > FLAT_ABOVE * math.log(n),
        "causal: with the causal mask every weight above the diagonal is 0 and every row sums to 1":
            bool((masked.triu(diagonal=1) == 0).all()) and rows_sum_to_one,
        "entropy: a one-hot row has entropy 0 and a uniform row ln n (n = 2, 6, 32)":
            all(h == 0 for h in one_hot) and all(abs(d) < 1e-5 for d in uniform),
    }.items()}


ROW = (2.0, 1.0, 0.5, -1.0)      # the one row of scores of the softmax experiment
ROW_SHARP_T, ROW_FLAT_T = 0.01, 100.0


def row_claims(softmax_with_temperature: Callable) -> dict[str, bool]:
    """Notebook 00's statements about one row of scores, ``ROW``, under a learner's (or the
    reference) ``softmax_with_temperature(scores, T)``: almost one-hot at ``T = 0.01``, almost
    uniform at ``T = 100``. Stated for this row only."""
    row = torch.tensor(ROW)
    sharp = softmax_with_temperature(row, ROW_SHARP_T)
    flat = softmax_with_temperature(row, ROW_FLAT_T)
    return {
        f"row {ROW}: at T = {ROW_SHARP_T} the largest score takes more than 0.999 of the weight":
            bool(sharp[row.argmax()] > 0.999),
        f"row {ROW}: at T = {ROW_FLAT_T:g} every weight is within 0.01 of 1/{len(ROW)}":
            bool(((flat - 1 / len(ROW)).abs() < 0.01).all()),
    }
