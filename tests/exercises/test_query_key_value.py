"""Notebook 02's checkers (``exercises.query_key_value``): the references pass and agree with
PyTorch, a stub is "not implemented yet" and nothing more, and every plausible wrong answer is
rejected with a message that names the mistake. Also the framework's generic verdicts
(``check_function``: wrong type, shape, in-place changes, exceptions)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from _exercises import assert_rejected, from_hint, stub

from attn_helpers.exercises import EXERCISES, CheckResult, Mistake, check_function
from attn_helpers.exercises import query_key_value as ex


def assert_passed(result):
    assert isinstance(result, CheckResult) and result and result.message.startswith("Passed")
    assert repr(result) == result.message



def test_the_exercises_are_registered_with_three_hints():
    for name in ("masked_softmax", "masked_attention", "entropy"):
        assert len(EXERCISES[f"query_key_value.{name}"].hints) == 3


@pytest.mark.parametrize("check, what", [(ex.check_masked_softmax, "masked_softmax"),
                                         (ex.check_masked_attention, "masked_attention"),
                                         (ex.check_entropy, "entropy")])
def test_a_stub_says_only_not_implemented(check, what):
    assert check(stub).message == f"{what} is not implemented yet."


# --- exercise 1: masked softmax ----------------------------------------------------------------


def masked_softmax(scores, mask):
    filled = scores.masked_fill(~mask, float("-inf"))
    return torch.nan_to_num(torch.softmax(filled, dim=-1), nan=0.0)


def masked_softmax_by_hand(scores, mask):
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    e = torch.exp(filled - filled.amax(dim=-1, keepdim=True)) * mask
    total = e.sum(dim=-1, keepdim=True)
    return e / total.clamp_min(torch.finfo(scores.dtype).tiny)


def test_masked_softmax_accepts_right_answers():
    for right in (masked_softmax, masked_softmax_by_hand,
                  lambda s, m: torch.softmax(s.masked_fill(~m, -1e30), -1) * m.any(-1, keepdim=True)):
        assert_passed(ex.check_masked_softmax(right))


def by_hand_no_max(scores, mask):
    e = torch.exp(scores) * mask
    return torch.nan_to_num(e / e.sum(-1, keepdim=True), nan=0.0)


def by_hand_max_of_masked(scores, mask):
    filled = scores.masked_fill(~mask, float("-inf"))
    e = torch.exp(filled - filled.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("wrong, fragments", [
    (lambda s, m: torch.softmax(s, -1), ["mask was ignored"]),
    (lambda s, m: masked_softmax(s, ~m), ["mask is inverted"]),
    (lambda s, m: torch.softmax(s.masked_fill(~m, 0.0), -1), ["exp(0) = 1"]),
    (lambda s, m: torch.softmax(s.masked_fill(~m, -torch.inf), -2), ["over the queries (dim=-2)"]),
    (lambda s, m: torch.softmax(s, -1) * m, ["no longer sum to one"]),
    (lambda s, m: torch.softmax(s.masked_fill(~m, -1e9), -1), ["came out uniform", "case 6 of 7"]),
    (lambda s, m: torch.softmax(s.masked_fill(~m, -torch.inf), -1),
     ["nan", "0 / 0 = NaN", "all-zero weights", "case 6 of 7"]),
    (by_hand_max_of_masked, ["nan", "all-zero weights", "case 6 of 7"]),
    (by_hand_no_max, ["came out as zeros", "overflows", "case 5 of 7"]),
    (lambda s, m: torch.exp(s) * m / (torch.exp(s) * m).sum(-1, keepdim=True),
     ["nan", "overflows", "case 5 of 7"]),
])
def test_masked_softmax_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_masked_softmax(wrong), *fragments)


# --- exercise 2: masked attention --------------------------------------------------------------


def attention(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])   # (..., n_q, n_k)
    weights = masked_softmax(scores, mask)                       # (..., n_q, n_k)
    return weights @ v, weights                                  # (..., n_q, d_v)


def test_the_reference_matches_pytorch_and_gives_zeros_on_fully_masked_rows():
    """Rows with an allowed key: equal to ``F.scaled_dot_product_attention``; a query that may
    see nothing: zero weights and zero output, never NaN."""
    for case in ex._attention_cases():
        out, weights = ex.masked_attention_reference(*case.values())
        q, k, v, mask = case.values()
        mask = mask.expand(weights.shape)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        some = mask.any(-1)
        assert torch.isfinite(out).all() and torch.isfinite(weights).all()
        assert torch.allclose(out[some], expected[some], atol=1e-6)
        assert (out[~some] == 0).all() and (weights[~some] == 0).all()
    assert any((~case["mask"].any(-1)).any() for case in ex._attention_cases())  # one is tried


def test_masked_attention_accepts_right_answers():
    def with_float_mask(Q, K, V, allowed):  # noqa: N803 - learners name things as they like
        bias = torch.zeros(allowed.shape, dtype=Q.dtype).masked_fill(~allowed, -torch.inf)
        w = torch.softmax(Q @ K.mT / Q.shape[-1] ** 0.5 + bias, -1).nan_to_num(0.0)
        return w @ V, w

    for right in (attention, with_float_mask, ex.masked_attention_reference):
        assert_passed(ex.check_masked_attention(right))


def attention_with(*, scale=None, dim=-1, fill=-torch.inf, invert=False, mix="v", zero=True):
    def wrong(q, k, v, mask):
        factor = 1 / math.sqrt(q.shape[-1]) if scale is None else scale(q, v)
        scores = (q @ k.mT * factor).masked_fill(mask if invert else ~mask, fill)
        w = torch.softmax(scores, dim)
        w = w.nan_to_num(0.0) if zero else w
        return w @ (v if mix == "v" else k), w
    return wrong


@pytest.mark.parametrize("wrong, fragments", [
    (attention_with(scale=lambda q, v: 1.0), ["not scaled"]),
    (attention_with(scale=lambda q, v: 1 / q.shape[-1]), ["divided by d_k"]),
    (attention_with(scale=lambda q, v: v.shape[-1] ** -0.5), ["sqrt(d_v)"]),
    (attention_with(dim=-2), ["over the queries (dim=-2)"]),
    (attention_with(dim=-2, zero=False), ["over the queries (dim=-2)"]),
    (attention_with(invert=True), ["mask is inverted", "case 1 of 7"]),
    (attention_with(fill=0.0), ["exp(0) = 1"]),
    (attention_with(mix="k"), ["mixes the keys"]),
    (attention_with(fill=-1e9), ["uniform weights", "case 6 of 7"]),
    (attention_with(zero=False), ["nan", "0 / 0 = NaN", "case 6 of 7"]),
    (lambda q, k, v, m: attention(q, k, v, m)[0], ["returned 1 value(s); expected 2"]),
    (lambda q, k, v, m: attention(q, k, v, m)[::-1], ["the output has shape (3, 4)"]),
])
def test_masked_attention_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_masked_attention(wrong), *fragments)


def test_masked_attention_reports_exceptions_and_in_place_changes():
    def raises(*_args):
        raise ZeroDivisionError("learner bug")

    assert_rejected(ex.check_masked_attention(raises), "raised ZeroDivisionError: learner bug")

    def scales_q_in_place(q, k, v, mask):
        q /= math.sqrt(q.shape[-1])
        return attention_with(scale=lambda q, v: 1.0)(q, k, v, mask)

    assert_rejected(ex.check_masked_attention(scales_q_in_place), "changed its input 'q' in place")


# --- exercise 3: entropy -----------------------------------------------------------------------


def entropy(p):
    return -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(-1)


def test_entropy_accepts_right_answers():
    for right in (entropy, lambda probs: torch.special.entr(probs).sum(dim=-1),
                  lambda p: -(p * torch.log(p.clamp_min(1e-30))).sum(-1)):
        assert_passed(ex.check_entropy(right))


@pytest.mark.parametrize("wrong, fragments", [
    (lambda p: -torch.where(p > 0, p * torch.log2(p), 0.0).sum(-1), ["bits"]),
    (lambda p: -torch.where(p > 0, p * torch.log10(p), 0.0).sum(-1), ["log base 10"]),
    (lambda p: -entropy(p), ["sign is flipped"]),
    (lambda p: -torch.where(p > 0, p * torch.log(p), 0.0).mean(-1), ["averaged over the keys"]),
    (lambda p: -torch.where(p > 0, p * torch.log(p), 0.0).sum(0), ["first dimension"]),
    (lambda p: -torch.where(p > 0, torch.log(p), 0.0).sum(-1), ["weighted by a_j"]),
    (lambda p: -(p * torch.log(p)).sum(-1), ["nan", "0 * ln 0", "(3, 3)"]),
    (lambda p: entropy(p)[..., None], ["shape (1,)", "shape ()"]),
    (lambda p: entropy(p) + 0.1, ["differs from the right answer", "largest difference 0.1"]),
])
def test_entropy_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_entropy(wrong), *fragments)


# --- the framework's generic verdicts ------------------------------------------------------------


@pytest.mark.parametrize("candidate", [None, 3, "softmax", torch.zeros(3)])
def test_check_function_non_callable(candidate):
    result = check_function(candidate, torch.relu, [{"x": torch.ones(2)}], what="your relu")
    assert_rejected(result, "your relu is not a function", type(candidate).__name__)


@pytest.mark.parametrize("solution, type_name",
                         [(lambda p: entropy(p).tolist(), "float"),
                          (lambda p: entropy(p).numpy(), "ndarray")])
def test_not_a_tensor_is_reported(solution, type_name):
    assert_rejected(ex.check_entropy(solution), "should be a torch.Tensor", type_name)


def test_check_function_generic():
    cases = [{"x": torch.tensor([-1.0, 2.0])}, {"x": torch.tensor([[3.0, -4.0]])}]
    assert_passed(check_function(lambda t: t.clamp_min(0), torch.relu, cases))
    mistake = Mistake(torch.abs, "you took the absolute value.")
    result = check_function(torch.abs, torch.relu, cases, mistakes=[mistake])
    assert_rejected(result, "case 1 of 2", "x: float32 (2,)", "Hint: you took the absolute value.")
    result = check_function(torch.neg, torch.relu, cases, mistakes=[mistake])
    assert_rejected(result, "case 1 of 2")
    assert "Hint" not in result.message



@pytest.mark.parametrize("key, signature, check", [
    ("query_key_value.masked_softmax", "scores, mask", ex.check_masked_softmax),
    ("query_key_value.masked_attention", "q, k, v, mask", ex.check_masked_attention),
    ("query_key_value.entropy", "weights", ex.check_entropy),
])
def test_the_third_hint_passes_once_it_is_in_the_stub(key, signature, check):
    assert check(from_hint(key, signature, masked_softmax=masked_softmax))
