"""Shared test setup: a headless matplotlib backend, figures closed after every test, a private
progress file, a seeded generator and the committed notebooks; ``_reference.py`` (independent
reference formulas) and ``_exercises.py`` are importable from every test."""

import sys
from pathlib import Path

import matplotlib

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `from _reference import ...`
NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))

matplotlib.use("Agg")  # before anything imports pyplot

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(autouse=True)
def _private_progress_file(tmp_path_factory, monkeypatch):
    """Exercise passes go to a fresh folder per test, never to the user's own progress file."""
    monkeypatch.setenv("ATTN_COURSE_PROGRESS_DIR", str(tmp_path_factory.mktemp("progress")))


@pytest.fixture
def gen() -> torch.Generator:
    """A freshly seeded generator, so every test draws the same numbers on every run."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def notebook(request):
    """``(path, notebook node)`` for every committed notebook: one added later is checked too."""
    import nbformat

    return request.param, nbformat.read(request.param, as_version=4)
