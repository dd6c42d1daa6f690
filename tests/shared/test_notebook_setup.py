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


def test_setup_seeds_every_stream_and_returns_a_seeded_generator():
    g = setup(123)
    first = torch.randn(6), np.random.rand(3), random.random()  # noqa: NPY002 - the legacy stream
    setup(123)
    again = torch.randn(6), np.random.rand(3), random.random()  # noqa: NPY002
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1])
    assert first[2] == again[2]
    expected = torch.randn(5, generator=torch.Generator().manual_seed(123))
    assert torch.equal(torch.randn(5, generator=g), expected)


def test_print_options_four_decimals_and_the_figure_style():
    setup(0)
    assert str(torch.tensor([1 / 3, 2 / 3, 12.0])) == "tensor([ 0.3333,  0.6667, 12.0000])"
    assert np.array2string(np.array([1 / 3, 2 / 3])) == "[0.3333 0.6667]"
    assert mpl.rcParams["figure.dpi"] == 90
