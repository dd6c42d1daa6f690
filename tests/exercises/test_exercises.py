"""The exercise checkers: right answers pass, each known mistake gets its hint."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.exercises import CheckResult, Mistake, check_function
from attn_helpers.exercises.query_key_value import check_attention, check_entropy, check_softmax

# --- learner solutions, right and wrong -----------------------------------------------------


def softmax_ok(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def softmax_naive(x):
    e = torch.exp(x)
    return e / e.sum(-1, keepdim=True)


def softmax_dim0(x):
    e = torch.exp(x - x.amax(0, keepdim=True))
    return e / e.sum(0, keepdim=True)


def softmax_in_place(x):
    x -= x.amax(-1, keepdim=True)
    e = x.exp()
    return e / e.sum(-1, keepdim=True)


def softmax_keepdim_sum(x):
    return softmax_ok(x).sum(-1, keepdim=True)


def attention_factory(*, scale=None, dim=-1, invert=False):
    def attention(query, key, value, allowed=None):
        factor = 1 / math.sqrt(query.shape[-1]) if scale is None else scale(query)
        scores = query @ key.transpose(-2, -1) * factor
        if allowed is not None:
            scores = scores.masked_fill(allowed if invert else ~allowed, float("-inf"))
        return torch.softmax(scores, dim=dim) @ value

    return attention


def attention_inverted_safe(q, k, v, mask=None):
    """Inverted mask, but rows with nothing allowed give zeros (no NaN)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, -1), nan=0.0)
    return weights @ v


def entropy_ok(p):
    return -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(-1)


def entropy_bits(p):
    return -torch.where(p > 0, p * torch.log2(p), torch.zeros_like(p)).sum(-1)


def entropy_flipped(p):
    return torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(-1)


def entropy_naive(p):
    return -(p * torch.log(p)).sum(-1)


def raises(*_args):
    raise ZeroDivisionError("learner bug")


def assert_passed(result):
    assert isinstance(result, CheckResult)
    assert bool(result) is True and result.passed
    assert result.message.startswith("Passed"), result.message
    assert repr(result) == result.message


def assert_failed(result, *fragments):
    assert isinstance(result, CheckResult)
    assert bool(result) is False and not result.passed
    assert result.message.startswith("Not yet"), result.message
    for fragment in fragments:
        assert fragment in result.message, (fragment, result.message)


# --- check_softmax --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "solution",
    [
        softmax_ok,
        lambda logits: torch.softmax(logits, dim=-1),
        lambda z: torch.softmax(z.double(), -1),
    ],
)
def test_softmax_correct(solution):
    assert_passed(check_softmax(solution))


def test_softmax_naive_overflow_gets_nan_hint():
    result = check_softmax(softmax_naive)
    assert_failed(result, "nan", "Hint:", "overflows", "Subtract each row's maximum")
    assert "(2, 3)" in result.message  # the case with logits of +-1000


def test_softmax_over_dim0_gets_hint():
    assert_failed(check_softmax(softmax_dim0), "Hint:", "first dimension", "dim=-1", "(3, 4)")


def test_softmax_in_place_is_reported():
    assert_failed(check_softmax(softmax_in_place), "changed its input 'x' in place")


def test_softmax_wrong_shape_names_both_shapes():
    # on the first case, x is (5,): summing with keepdim gives (1,)
    assert_failed(check_softmax(softmax_keepdim_sum), "has shape (1,)", "has shape (5,)")


def test_softmax_exception_reported_by_type_and_message():
    assert_failed(check_softmax(raises), "raised ZeroDivisionError: learner bug", "case 1 of")


@pytest.mark.parametrize(
    "solution, type_name",
    [(lambda x: softmax_ok(x).tolist(), "list"), (lambda x: softmax_ok(x).numpy(), "ndarray")],
)
def test_softmax_not_a_tensor(solution, type_name):
    """A learner returning a list or a numpy array is told so; the checker must not crash."""
    assert_failed(check_softmax(solution), "should be a torch.Tensor", type_name)


# --- check_attention ------------------------------------------------------------------------


def test_attention_correct():
    assert_passed(check_attention(attention_factory()))


def test_attention_correct_with_other_parameter_names():
    def attend(Q, K, V, M):  # noqa: N803 - learners name things as they like
        s = Q @ K.mT / Q.shape[-1] ** 0.5
        if M is not None:
            s = s.masked_fill(M.logical_not(), -1e9)
        return s.softmax(-1) @ V

    assert_passed(check_attention(attend))


@pytest.mark.parametrize(
    "solution, hint",
    [
        (attention_factory(scale=lambda q: 1.0), "not scaled"),
        (attention_factory(scale=lambda q: 1.0 / q.shape[-1]), "divided by d_k"),
        (attention_factory(dim=-2), "dim=-2"),
        (attention_inverted_safe, "the mask is inverted"),
        (attention_factory(invert=True), "inverted"),
    ],
)
def test_attention_mistakes_get_hints(solution, hint):
    result = check_attention(solution)
    assert_failed(result, "Hint:", hint)


def test_attention_inverted_mask_nan_hint():
    result = check_attention(attention_factory(invert=True))
    assert_failed(result, "nan", "all -inf", "~mask", "mask: bool (6, 6)")


def test_attention_mistake_hints_are_not_mixed_up():
    unscaled = check_attention(attention_factory(scale=lambda q: 1.0)).message
    by_dk = check_attention(attention_factory(scale=lambda q: 1.0 / q.shape[-1])).message
    assert "divided by d_k" not in unscaled
    assert "not scaled" not in by_dk


def test_attention_wrong_shape_and_count():
    result = check_attention(lambda q, k, v, mask: attention_factory()(q, k, v, mask).mT)
    assert_failed(result, "shape (5, 3)", "shape (3, 5)")
    result = check_attention(lambda q, k, v, mask: (attention_factory()(q, k, v, mask), q))
    assert_failed(result, "returned 2 value(s); expected 1")


def test_attention_exception_and_mutation():
    assert_failed(check_attention(raises), "raised ZeroDivisionError: learner bug")

    def scales_q_in_place(q, k, v, mask=None):
        q /= math.sqrt(q.shape[-1])
        return torch.softmax(q @ k.mT, -1) @ v

    assert_failed(check_attention(scales_q_in_place), "changed its input 'q' in place")


# --- check_entropy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "solution", [entropy_ok, lambda probs: torch.special.entr(probs).sum(dim=-1)]
)
def test_entropy_correct(solution):
    assert_passed(check_entropy(solution))


@pytest.mark.parametrize(
    "solution, fragments",
    [
        (entropy_bits, ("Hint:", "bits", "natural log")),
        (lambda w: entropy_ok(w) / math.log(2), ("Hint:", "bits")),
        (entropy_flipped, ("Hint:", "sign is flipped")),
        (entropy_naive, ("nan", "Hint:", "0 * ln 0", "(3, 3)")),
    ],
)
def test_entropy_mistakes(solution, fragments):
    assert_failed(check_entropy(solution), *fragments)


def test_entropy_wrong_shape_exception_mutation():
    assert_failed(check_entropy(lambda w: entropy_ok(w)[..., None]), "shape (1,)", "shape ()")
    assert_failed(check_entropy(raises), "raised ZeroDivisionError: learner bug")

    def clamps_in_place(w):
        w.clamp_(min=1e-12)
        return entropy_naive(w)

    assert_failed(check_entropy(clamps_in_place), "changed its input 'weights' in place")


def test_entropy_wrong_values_names_index_and_numbers():
    result = check_entropy(lambda w: entropy_ok(w) + 0.1)
    assert_failed(result, "differs from the right answer", "largest difference 0.1")
    assert "Hint:" not in result.message  # no known mistake matches a shift by 0.1


# --- check_function -------------------------------------------------------------------------


@pytest.mark.parametrize("candidate", [None, 3, "softmax", torch.zeros(3)])
def test_check_function_non_callable(candidate):
    result = check_function(candidate, torch.relu, [{"x": torch.ones(2)}], what="your relu")
    assert_failed(result, "your relu is not a function", type(candidate).__name__)


def test_check_function_generic():
    cases = [{"x": torch.tensor([-1.0, 2.0])}, {"x": torch.tensor([[3.0, -4.0]])}]
    assert_passed(check_function(lambda t: t.clamp_min(0), torch.relu, cases))
    mistake = Mistake(torch.abs, "you took the absolute value.")
    result = check_function(torch.abs, torch.relu, cases, mistakes=[mistake])
    assert_failed(result, "case 1 of 2", "x: float32 (2,)", "Hint: you took the absolute value.")
    result = check_function(torch.neg, torch.relu, cases, mistakes=[mistake])
    assert_failed(result, "case 1 of 2")
    assert "Hint" not in result.message
