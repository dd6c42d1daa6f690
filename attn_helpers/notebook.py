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
    """Seed every random source, set readable print options and the course's plot style.

    ``seed``: an int, ``0 <= seed < 2**32`` (the range numpy accepts). Returns a
    ``torch.Generator`` seeded with ``seed`` for cells that want their own stream.
    Printed tensors show 4 decimals, so stored outputs reproduce across machines.
    """
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
    """Print each claim of a lesson's ``claims(...)`` as ``✓ statement`` (``✗`` when it fails), then
    assert that all hold. The one way every notebook shows its claims.

    ``recorded``: for claims read from a committed file rather than measured in the reader's run,
    where and when they were measured (``"2-core x86 CPU, 2026-11-21"``); printed above them.
    """
    if recorded is not None and not isinstance(recorded, str):
        raise TypeError(f"recorded must be a string (where and when), got {type(recorded).__name__}")
    if recorded is not None:
        print(f"Recorded results ({recorded}), re-read from the stored file, not measured now:")
    _report(claims, "claims", "claims")


def sanity_checks(checks: dict) -> None:
    """Print and assert checks that cannot fail unless the code is broken (equalities with torch,
    shapes, sums to one): shown apart from claims about results, one per line."""
    print("Sanity checks (these hold by construction; they guard the code, not a finding):")
    _report(checks, "checks", "sanity checks")
