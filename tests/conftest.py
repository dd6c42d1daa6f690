"""Shared test setup: a headless matplotlib backend, and figures closed after every test."""

import matplotlib

matplotlib.use("Agg")  # before anything imports pyplot

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture
def gen() -> torch.Generator:
    """A freshly seeded generator, so every test draws the same numbers on every run."""
    return torch.Generator().manual_seed(1234)
