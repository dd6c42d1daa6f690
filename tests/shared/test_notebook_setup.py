"""notebook.setup: seeds, print options, plot style; restored after each test."""

from __future__ import annotations

import random

import matplotlib as mpl
import numpy as np
import pytest
import torch

from attn_helpers.notebook import setup


@pytest.fixture(autouse=True)
def _restore_global_state():
    np_options = np.get_printoptions()
    with mpl.rc_context():
        yield
    torch.set_printoptions(profile="default")
    np.set_printoptions(**np_options)


def test_setup_makes_randn_reproducible():
    setup(123)
    first = torch.randn(6)
    first_np = np.random.rand(3)  # noqa: NPY002 - setup seeds the legacy global stream
    first_py = random.random()
    torch.randn(100)  # move every stream on
    np.random.rand(10)  # noqa: NPY002
    random.random()
    setup(123)
    assert torch.equal(torch.randn(6), first)
    assert np.array_equal(np.random.rand(3), first_np)  # noqa: NPY002
    assert random.random() == first_py
    setup(124)
    assert not torch.equal(torch.randn(6), first)
    # the same numbers as seeding torch by hand
    setup(7)
    assert torch.equal(torch.randn(4), torch.randn(4, generator=torch.Generator().manual_seed(7)))


def test_setup_returns_a_seeded_generator():
    g = setup(42)
    assert isinstance(g, torch.Generator)
    expected = torch.randn(5, generator=torch.Generator().manual_seed(42))
    assert torch.equal(torch.randn(5, generator=g), expected)
    g2 = setup(42)
    assert g2 is not g
    assert torch.equal(torch.randn(5, generator=g2), expected)
    assert setup().initial_seed() == 0


def test_print_options_four_decimals():
    setup(0)
    text = str(torch.tensor([1 / 3, 2 / 3, 12.0]))
    assert "0.3333" in text and "0.6667" in text
    assert "0.33333" not in text and "e+" not in text and "e-" not in text
    assert np.array2string(np.array([1 / 3, 2 / 3])) == "[0.3333 0.6667]"
    assert str(torch.tensor([2.0, 1e-5])) == "tensor([2.0000, 0.0000])"
    assert mpl.rcParams["figure.dpi"] == 90
