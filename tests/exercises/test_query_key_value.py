"""Notebook 02's checkers (``exercises.query_key_value``): right answers pass, a stub is "not
implemented yet" and nothing more, and every named mistake gets its hint. Also the framework's
generic verdicts (``check_function``: wrong type, shape, in-place changes, exceptions)."""

from __future__ import annotations

import math

import pytest
import torch
from _exercises import assert_rejected, assert_skeleton, one_hot_only

from attn_helpers.exercises import EXERCISES, CheckResult, check_function
from attn_helpers.exercises import query_key_value as ex


def assert_passed(result):
    assert isinstance(result, CheckResult) and result and result.message.startswith("Passed")
    assert repr(result) == result.message


# --- exercise 1: attention, masked --------------------------------------------------------------


def masked_softmax(scores, mask):
    filled = scores.masked_fill(~mask, float("-inf"))
    return torch.nan_to_num(torch.softmax(filled, dim=-1), nan=0.0)


def attention(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])   # (..., n_q, n_k)
    weights = masked_softmax(scores, mask)                       # (..., n_q, n_k)
    return weights @ v, weights                                  # (..., n_q, d_v)


def test_attention_accepts_right_answers():
    def with_float_mask(Q, K, V, allowed):  # noqa: N803 - learners name things as they like
        bias = torch.zeros(allowed.shape, dtype=Q.dtype).masked_fill(~allowed, -torch.inf)
        w = torch.softmax(Q @ K.mT / Q.shape[-1] ** 0.5 + bias, -1).nan_to_num(0.0)
        return w @ V, w

    for right in (attention, with_float_mask):
        assert_passed(ex.check_attention(right))
        assert "so do its gradients" in ex.check_attention(right).message


@pytest.mark.parametrize("mistake", ex._ATTENTION_MISTAKES, ids=range(len(ex._ATTENTION_MISTAKES)))
def test_attention_names_each_known_mistake_with_its_hint(mistake):
    assert_rejected(ex.check_attention(mistake.produce), "\nHint: " + mistake.hint)


@pytest.mark.parametrize("wrong, fragments", [
    (lambda q, k, v, m: attention(q, k, v, m)[::-1],
     ["returned the output with shape (3, 4)", "you returned (weights, output)"]),
    (lambda q, k, v, m: attention(q, k, v, torch.ones_like(m)), ["case 1 of 8", "mask was not applied"]),
    (lambda q, k, v, m: attention(q, k, v, m.mT), ["case 1 of 8", "handed the mask transposed"]),
    (lambda q, k, v, m: ex._attention(lambda s, m: (s - 1e4 * ~m).softmax(-1))(q, k, v, m),  # added
     ["case 6 of 8", "no allowed key must read nothing", "an added -1e4"]),
    (lambda *a: tuple(t.tolist() for t in attention(*a)), ["return a torch.Tensor", "list"]),
    (lambda *a: tuple(t.float() for t in attention(*a)), ["case 3 of 8", "as torch.float32"]),
    (torch.no_grad()(attention), ["right values", "gradient into q, k, v differs", "torch.no_grad()"]),
    (lambda q, k, v, m: attention(q, k.detach(), v, m), ["gradient into k differs", "not train"]),
])
def test_attention_names_what_a_learner_returned(wrong, fragments):
    assert_rejected(ex.check_attention(wrong), *fragments)


def exp_times_mask(*, clamp=False):
    def wrong(q, k, v, mask):  # no maximum subtracted, masked by multiplying the exps
        e = (q @ k.mT / q.shape[-1] ** 0.5).exp() * mask
        if clamp:  # an empty row gives 0, but inf / inf on the scores in the 1000s stays NaN
            return (w := e / e.sum(-1, keepdim=True).clamp_min(1e-30)) @ v, w
        w = (e / e.sum(-1, keepdim=True)).nan_to_num(0.0)   # hides the overflow's NaN as 0
        return w @ v, w
    return wrong


@pytest.mark.parametrize("clamp", [False, True])
def test_any_miss_on_the_large_score_case_gets_the_overflow_hint(clamp):
    result = ex.check_attention(exp_times_mask(clamp=clamp))
    assert_rejected(result, "case 8 of 8", "Hint: every case with small scores passed",
                    "exp(1000)", "Subtract each row's maximum")
    assert "all masked" not in result.message       # case 8 has no row without a key
    found = result.message.split("Hint")[0]          # NaN left in the output, or hidden as 0
    assert ("nan" in found) is clamp, found


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
def test_k_dot_T_on_batched_inputs_gets_a_named_hint():
    def with_dot_T(q, k, v, mask):                      # noqa: N802 - .T reverses every axis
        weights = masked_softmax(q @ k.T / math.sqrt(q.shape[-1]), mask)
        return weights @ v, weights

    assert_rejected(ex.check_attention(with_dot_T), "Hint: ", "reverses every axis",
                    "Swap only the last two axes")


def test_attention_reports_exceptions_and_in_place_changes():
    def raises(*_args):
        raise ZeroDivisionError("learner bug")

    assert_rejected(ex.check_attention(raises), "raised ZeroDivisionError: learner bug")

    def scales_q_in_place(q, k, v, mask):
        q /= math.sqrt(q.shape[-1])
        return ex._attention(scale=lambda q, k, v: 1.0)(q, k, v, mask)

    assert_rejected(ex.check_attention(scales_q_in_place), "changed its input 'q' in place")

    def zeroes_nan_in_place(q, k, v, mask):   # w[w != w] = 0 edits a tensor autograd saved
        w = ex._attention(lambda s, m: ex._masked(s, m).softmax(-1))(q, k, v, mask)[1]
        w[w != w] = 0
        return w @ v, w

    assert_rejected(ex.check_attention(zeroes_nan_in_place), "backward fails", "changed in place")


# --- exercise 2: attend to the next token (separate W_Q and W_K) ----------------------------------


def next_projections(X, c=None):  # noqa: N803 - c from n unless given (a fixed c fails long rows)
    n = X.shape[0]
    c = math.sqrt(math.sqrt(n) * (math.log(n - 1) + 4)) if c is None else c
    W_Q = c * torch.linalg.pinv(X)                                        # noqa: N806
    return W_Q, W_Q @ torch.roll(torch.eye(n, dtype=X.dtype), 1, dims=1).T


def test_asymmetric_relation_accepts_right_answers():
    def by_solve(X):  # noqa: N803 - X W_Q = c I, X W_K = c P^T, wider d_k, c from n and d_k
        n = X.shape[0]
        target = torch.cat([torch.eye(n, dtype=X.dtype), torch.zeros(n, 2, dtype=X.dtype)], 1)
        c = math.sqrt(math.sqrt(n + 2) * 2 * math.log(10 * n))
        W_Q = (torch.linalg.pinv(X.double()) @ (c * target.double())).to(X.dtype)  # noqa: N806
        shift = torch.roll(torch.eye(n, dtype=X.dtype), 1, dims=0)            # P^T
        W_K = torch.linalg.pinv(X.double()) @ shift.double() @ (X.double() @ W_Q.double())  # noqa: N806
        return W_Q, W_K.to(X.dtype)  # solved in float64: float32 lstsq/pinv varied with threads

    for right in (next_projections, by_solve):
        assert_passed(ex.check_asymmetric_relation(right))


@pytest.mark.parametrize("wrong, fragments", [
    (lambda X: (10 * torch.linalg.pinv(X),) * 2, ["W_Q = W_K", "symmetric"]),
    (lambda X: next_projections(X)[::-1], ["PREVIOUS token"]),
    (lambda X: (next_projections(X)[0], next_projections(X)[0] * 1.0001), ["attends to itself"]),
    (lambda X: (next_projections(X)[0], -next_projections(X)[0]),        # W_K = -W_Q
     ["case 1 of 6", "symmetric", "Q K^T equals its transpose", "W_K = -W_Q"]),
    (lambda X: next_projections(X, c=math.log(99 * (X.shape[0] - 1)) ** 0.5),  # c^2 = gap: no sqrt(d_k)
     ["case 1 of 6", "not strongly enough", "Without the 1/sqrt(d_k)", "sqrt(d_k) = 2.00",
      "after that division"]),
    (lambda X: next_projections(X, c=10.0), ["case 6 of 6", "7.49", "c must grow with n"]),
    (one_hot_only, ["one-hot", "right inverse", "case 3 of 6"]),
    (lambda X: (w := 9 * torch.linalg.pinv(X), w @ torch.eye(len(X), dtype=X.dtype).roll(1, 1).triu().T),
     ["3->tie;", "last token must attend to the first"]),                # no wrap: P without its corner
    (lambda X: (w := 5 * torch.linalg.inv(X), w @ torch.eye(len(X), dtype=X.dtype).roll(1, 1).T),
     ["case 2 of 6", "needs a square matrix", "right inverse", "hint 2 names"]),   # inv, not pinv
    (lambda X: (next_projections(X)[0], next_projections(X)[1][:, :-1]), ["same size d_k"]),
    (lambda X: next_projections(X)[0], ["should return a pair"]),
    (lambda X: (next_projections(X)[0].T, next_projections(X)[1]), ["W_Q must be a (d_model, d_k)"]),
    (lambda X: (torch.linalg.pinv(X), torch.linalg.pinv(X) @ torch.eye(5).roll(1, 1)),  # n fixed: 5
     ["case 1 of 6", "shapes cannot be multiplied", "X.shape[0]"]),
    (lambda X: (w := 10 * torch.linalg.pinv(X).T, w @ torch.eye(len(X)).roll(1, 1).T),  # (n, d_model)
     ["case 2 of 6", "shapes cannot be multiplied", "(d_model, n)"]),
])
def test_asymmetric_relation_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_asymmetric_relation(wrong), *fragments)


def test_a_float32_tensor_on_the_float64_case_gets_the_dtype_hint():
    def float32_shift(X):  # noqa: N803 - P from torch.eye(n): float32 whatever X is
        W_Q = 3 * math.log(10 * len(X)) * torch.linalg.pinv(X)              # noqa: N806
        return W_Q, W_Q @ torch.roll(torch.eye(len(X)), 1, dims=1).T

    assert_rejected(ex.check_asymmetric_relation(float32_shift), "case 4 of 6", "same dtype",
                    "Hint: ", "dtype=X.dtype")


def test_the_sqrt_d_k_hint_is_given_only_when_the_unscaled_scores_would_pass():
    result = ex.check_asymmetric_relation(lambda X: next_projections(X, c=1.0))  # too small anyway
    assert_rejected(result, "not strongly enough", "scale both projections")
    assert "sqrt(d_k)" not in result.message.split("Hint")[0] and "Without the" not in result.message


def test_exercise_2s_third_hint_asks_for_c_and_does_not_give_it():
    third = EXERCISES["query_key_value.asymmetric_relation"].hints[2]
    c_line = next(line for line in third.splitlines() if line.startswith("c = ..."))
    assert "?" in c_line and "e^" not in c_line and "log" not in c_line   # a question, no formula


@pytest.mark.parametrize("candidate", [None, torch.zeros(3)])
def test_check_function_non_callable(candidate):
    result = check_function(candidate, torch.relu, [{"x": torch.ones(2)}], what="your relu")
    assert_rejected(result, "your relu is not a function", type(candidate).__name__)


@pytest.mark.parametrize("key, signature, check, fills", [
    ("query_key_value.attention", "q, k, v, mask", ex.check_attention,
     ("q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5", "~mask",
      "torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)")),
    ("query_key_value.asymmetric_relation", "X", ex.check_asymmetric_relation,
     ("torch.roll(torch.eye(n, dtype=X.dtype), 1, dims=1)",
      "(math.sqrt(n) * math.log(99 * (n - 1))) ** 0.5", "c * torch.linalg.pinv(X)", "W_Q @ P.T")),
])
def test_the_third_hint_is_a_skeleton_that_passes_once_its_key_lines_are_written(
        key, signature, check, fills):
    assert_skeleton(key, signature, check, fills)
