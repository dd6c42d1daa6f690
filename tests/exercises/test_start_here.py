"""Notebook 00's checkers (``exercises.start_here``): the reference passes, each planted mistake
is named, and a wrong answer that is no planted mistake still fails."""

from __future__ import annotations

import torch

from attn_helpers.exercises.start_here import check_one_hot_row, check_uniform_row


def one_hot(n, j):
    row = torch.zeros(n)
    row[j] = 1.0
    return row


def test_one_hot_row_checker():
    assert check_one_hot_row(one_hot).passed

    def off_by_one(n, j):
        return one_hot(n, (j + 1) % n)

    result = check_one_hot_row(off_by_one)
    assert not result.passed and "from 0" in result.message
    assert not check_one_hot_row(lambda n, j: torch.ones(n) / n).passed


def test_uniform_row_checker():
    assert check_uniform_row(lambda n: torch.full((n,), 1.0 / n)).passed
    result = check_uniform_row(lambda n: torch.ones(n))
    assert not result.passed and "divide by n" in result.message
    assert not check_uniform_row(lambda n: one_hot(n, 0)).passed
