r"""The known wrong answers of notebook 03's exercise 3 (``scaling.jacobian_norm``): the Frobenius
norm of each row's softmax Jacobian :math:`J = D - P`, :math:`D = \mathrm{diag}(a)`,
:math:`P = a a^\top`, from sums over the row's weights. Each is written from the power sums
:math:`p_k = \sum_i a_i^k` of a row (:func:`_from_sums`), which with the right combination give the
right answer, so the checker refuses them, whether called from a learner's function (they are
private) or handed in as one (:data:`SUMS_CODE`).
A wrong answer that needs J itself (its spectral norm, say) is not among them: the checker refuses
any tensor as large as J before it compares."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import Mistake

__all__ = ["NORM_MISTAKES", "SUMS_CODE"]


def _root(squared: torch.Tensor) -> torch.Tensor:
    return squared.clamp(min=0).sqrt()


def _from_sums(combine: Callable, *, dim: int | None = -1, mean: bool = False,
               keepdim: bool = False) -> Callable:
    """``a (..., n) -> combine(p_2, p_3, p_4)`` with ``p_k`` the sum (or, with ``mean``, the mean)
    of ``a ** k`` over ``dim`` (``None``: the whole tensor)."""

    def power_sum(a: torch.Tensor, k: int) -> torch.Tensor:
        powers = a ** k
        if dim is None:
            return powers.mean() if mean else powers.sum()
        return powers.mean(dim, keepdim=keepdim) if mean else powers.sum(dim, keepdim=keepdim)

    return lambda a: combine(power_sum(a, 2), power_sum(a, 3), power_sum(a, 4))


#: The code of every answer :func:`_from_sums` makes: handed in as the learner's function, it is
#: the checker's own (right, with :func:`_right`) answer, refused by the checker.
SUMS_CODE = _from_sums(lambda p2, p3, p4: p2).__code__


def _right(p2: torch.Tensor, p3: torch.Tensor, p4: torch.Tensor) -> torch.Tensor:
    return _root(p2 - 2 * p3 + p2 ** 2)             # |D|^2 - 2 <D, P> + |P|^2


NORM_MISTAKES = [
    Mistake(_from_sums(lambda p2, p3, p4: p2 - 2 * p3 + p2 ** 2),
            "that is |J|_F^2, the squared norm: take its square root."),
    Mistake(_from_sums(lambda p2, p3, p4: _root(p2 - 2 * p3 + p4)),
            "that is the diagonal of J alone, sum_i a_i^2 (1 - a_i)^2 (also what sum_i a_i^4 in "
            "place of (sum_i a_i^2)^2 gives): the off-diagonal entries -a_i a_j count too. "
            "|a a^T|_F^2 = sum_i sum_j a_i^2 a_j^2 is a product of two sums."),
    Mistake(_from_sums(lambda p2, p3, p4: _root(p2 + 2 * p3 + p2 ** 2)),
            "the cross term has the wrong sign: with D = diag(a) and P = a a^T, |D - P|_F^2 = "
            "|D|^2 - 2 <D, P> + |P|^2, a minus in front of <D, P>."),
    Mistake(_from_sums(lambda p2, p3, p4: _root(p2 - p3 + p2 ** 2)),
            "the cross term counts twice: with D = diag(a) and P = a a^T, |D - P|_F^2 = |D|^2 - "
            "2 <D, P> + |P|^2, so <D, P> = sum_i a_i^3 comes with a factor 2."),
    Mistake(_from_sums(lambda p2, p3, p4: _root(p2 - 2 * p3)),
            "the |P|^2 term is missing: |D - P|_F^2 = |D|^2 - 2 <D, P> + |P|^2, and P = a a^T has "
            "|P|_F^2 = sum_i sum_j a_i^2 a_j^2 = (sum_i a_i^2)^2."),
    Mistake(_from_sums(lambda p2, p3, p4: _root(p2 - 4 * p3 + p2 ** 2)),
            "the cross term's factor is off: |D - P|_F^2 = |D|^2 - 2 <D, P> + |P|^2, and "
            "<D, P> = sum_i D_ii P_ii = sum_i a_i^3 (only the diagonal of P meets D), so -2 "
            "sum_i a_i^3."),
    Mistake(_from_sums(lambda p2, p3, p4: _root(p2 - p2 ** 2)),
            "the cross term is off: <D, P> = sum_ij D_ij P_ij is not (sum_i a_i^2)^2, which is "
            "|P|^2, the third term. D = diag(a) is zero off its diagonal, so only the diagonal "
            "entries of P meet it."),
    Mistake(_from_sums(lambda p2, p3, p4: p2.sqrt()),
            "that is |diag(a)|_F = |a|, the first term alone: J = diag(a) - a a^T, and the outer "
            "product changes the norm."),
    Mistake(_from_sums(lambda p2, p3, p4: p2),
            "that is |a a^T|_F = sum_i a_i^2, the outer product alone: J = diag(a) - a a^T has the "
            "diagonal term too."),
    Mistake(_from_sums(lambda p2, p3, p4: _root(p2 ** 2 - p4)),
            "that is the off-diagonal part of J alone: its diagonal entries a_i (1 - a_i) count too."),
    Mistake(_from_sums(lambda p2, p3, p4: _root(2 * p2 - 2 * p3)),
            "|a a^T|_F^2 = sum_i sum_j a_i^2 a_j^2 is the square of sum_i a_i^2, not sum_i a_i^2 "
            "itself."),
    Mistake(_from_sums(lambda p2, p3, p4: _root(p2 - 2 * p3 + 1)),
            "|a a^T|_F^2 = sum_i sum_j a_i^2 a_j^2 = (sum_i a_i^2)^2; (sum_i a_i)^2 is 1 for "
            "every row."),
    Mistake(_from_sums(_right, mean=True),
            "you averaged over the keys where the expansion sums: every term of |J|_F^2 is a sum "
            "over i (and j), not a mean (.sum(dim=-1), not .mean(dim=-1))."),
    Mistake(_from_sums(_right, dim=0),
            "the sums ran over the wrong axis: a row of weights is the last axis (the keys), so "
            "sum over dim=-1, one norm per row."),
    Mistake(_from_sums(_right, dim=None),
            "you summed over the whole tensor: each row has its own J, so sum over the last axis "
            "only (dim=-1), one norm per row."),
    Mistake(_from_sums(_right, keepdim=True),
            "the answer has one number per row and no summed axis: shape (...), not (..., 1); drop "
            "keepdim=True."),
]
