"""One setup call at the top of every notebook: seeds, print options and plot style."""

from __future__ import annotations

import random

import matplotlib as mpl
import numpy as np
import torch

from ._checks import require_int_in

__all__ = ["setup", "PLOT_STYLE", "check_claims", "sanity_checks"]

PLOT_STYLE = {
    "figure.dpi": 90,
    "figure.figsize": (7.0, 4.0),
    "figure.constrained_layout.use": True,
    "axes.grid": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "font.size": 10,
    "image.cmap": "viridis",
    "savefig.bbox": "tight",
}


def setup(seed: int = 0) -> torch.Generator:
    """Seed every random source (``0 <= seed < 2**32``), print 4 decimals, set the plot style;
    returns a ``torch.Generator`` seeded with ``seed``."""
    require_int_in("seed", seed, 0, 2**32 - 1)                 # numpy's legacy seeds: 0 <= seed < 2**32
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (seeds the legacy global stream learners may use)
    torch.manual_seed(seed)
    torch.set_printoptions(precision=4, sci_mode=False, linewidth=100)
    np.set_printoptions(precision=4, suppress=True, linewidth=100)
    mpl.rcParams.update(PLOT_STYLE)
    return torch.Generator().manual_seed(seed)


def _report(checks, arg: str, what: str) -> None:
    if not isinstance(checks, dict) or not checks:
        raise TypeError(f"{arg} must be a non-empty dict of {{statement: bool}}, "
                        f"got {type(checks).__name__}")
    failed = []
    for statement, holds in checks.items():
        if not isinstance(holds, bool | np.bool_) and not (isinstance(holds, torch.Tensor)
                                                            and holds.numel() == 1):
            raise TypeError(f"{arg}[{statement!r}] must be a bool, got {type(holds).__name__}")
        holds = bool(holds)
        print(f"{'✓' if holds else '✗'} {statement}")
        if not holds:
            failed.append(statement)
    if failed:
        raise AssertionError(f"{len(failed)} of {len(checks)} {what} do not hold: " + "; ".join(failed))


def check_claims(claims: dict, *, recorded: str | None = None) -> None:
    """Print each ``{statement: bool}`` as ``✓``/``✗ statement``, then assert all hold;
    ``recorded``: where claims read from a stored record were measured, printed above them."""
    if recorded is not None and not isinstance(recorded, str):
        raise TypeError(f"recorded must be a string (where and when), got {type(recorded).__name__}")
    if recorded is not None:
        print(f"Recorded results ({recorded}), re-read from the stored file, not measured now:")
    _report(claims, "claims", "claims")


def sanity_checks(checks: dict) -> None:
    """Print and assert checks that hold by construction, apart from claims about results."""
    print("Sanity checks (these hold by construction; they guard the code, not a finding):")
    _report(checks, "checks", "sanity checks")
