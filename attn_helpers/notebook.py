"""One setup call at the top of every notebook: seeds, print options and plot style."""

from __future__ import annotations

import random

import matplotlib as mpl
import numpy as np
import torch

from ._checks import require_int_in

__all__ = ["setup", "PLOT_STYLE"]

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
