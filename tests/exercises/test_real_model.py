"""Notebook 09's checkers (``exercises.real_model``): the references pass, stubs are "not
implemented yet", and plausible wrong answers, written as a learner would, are rejected with a
message naming the mistake."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers.exercises import hint
from attn_helpers.exercises import real_model as ex
from attn_helpers.lessons.real_model import entropy_grid, offset_scores

# --- learner-style answers to exercise 1: previous_token_scores(weights, mask) -> (L, h) --------


def previous_reference(weights, mask):
    n = weights.shape[-1]
    i = torch.arange(1, n)
    on_previous = weights[..., i, i - 1]                       # (L, b, h, n - 1)
    valid = mask[:, 1:][None, :, None, :].float()
    return (on_previous * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3))


def previous_loop(weights, mask):  # a slow, different-looking correct answer
    L, b, h, n, _ = weights.shape
    out = torch.zeros(L, h)
    for layer in range(L):
        for head in range(h):
            values = [weights[layer, s, head, i, i - 1] for s in range(b) for i in range(1, n)
                      if mask[s, i]]
            out[layer, head] = torch.stack(values).mean()
    return out


def next_token(weights, mask):
    n = weights.shape[-1]
    i = torch.arange(0, n - 1)
    valid = mask[:, 1:][None, :, None, :].float()
    return (weights[..., i, i + 1] * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3))


def own_token(weights, mask):
    valid = mask[None, :, None, :].float()
    return (weights.diagonal(dim1=-2, dim2=-1) * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3))


def transposed(weights, mask):
    return previous_reference(weights.transpose(-1, -2), mask)


def with_padding(weights, mask):
    n = weights.shape[-1]
    i = torch.arange(1, n)
    return weights[..., i, i - 1].mean(dim=(1, 3))


def first_counts_as_zero(weights, mask):
    n = weights.shape[-1]
    i = torch.arange(1, n)
    on_previous = torch.cat([torch.zeros_like(weights[..., :1, 0]), weights[..., i, i - 1]], -1)
    valid = mask[None, :, None, :].float()
    return (on_previous * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3))


def summed(weights, mask):
    n = weights.shape[-1]
    i = torch.arange(1, n)
    return (weights[..., i, i - 1] * mask[:, 1:][None, :, None, :]).sum(dim=(1, 3))


def per_sentence_mean(weights, mask):  # the right shape, but no mean over the batch
    return previous_reference(weights, mask)[None].expand(weights.shape[1], -1, -1)


PREVIOUS_WRONG = [
    (next_token, "NEXT token"),
    (own_token, "on itself"),
    (transposed, "Rows are queries"),
    (with_padding, "padding queries"),
    (first_counts_as_zero, "no previous token"),
    (summed, "you summed"),
    (per_sentence_mean, "has shape"),
]


def test_previous_token_checker_accepts_correct_answers():
    assert ex.check_previous_token_scores(previous_reference)
    assert ex.check_previous_token_scores(previous_loop)
    assert ex.check_previous_token_scores(lambda w, m: offset_scores(w, m, -1))


@pytest.mark.parametrize("wrong, named", PREVIOUS_WRONG, ids=[w.__name__ for w, _ in PREVIOUS_WRONG])
def test_previous_token_checker_names_the_mistake(wrong, named):
    verdict = ex.check_previous_token_scores(wrong)
    assert not verdict
    assert verdict.message.startswith("Not yet")
    assert named in verdict.message, verdict.message


# --- exercise 2: head_entropy(weights, mask) -> (entropy (L, h), fraction (L, h)) --------------


def entropy_reference(weights, mask):
    H = -torch.xlogy(weights, weights).sum(-1)                         # (L, b, h, n)
    ln_n = torch.log(mask.sum(1).float())[None, :, None, None]         # (1, b, 1, 1)
    valid = mask[None, :, None, :].float()

    def mean(x):
        return (x * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3))

    return mean(H), mean(H / ln_n)


def entropy_loop(weights, mask):
    L, b, h, n, _ = weights.shape
    H_out, F_out = torch.zeros(L, h), torch.zeros(L, h)
    for layer in range(L):
        for head in range(h):
            H, F = [], []
            for s in range(b):
                k = int(mask[s].sum())
                for i in range(k):
                    p = weights[layer, s, head, i, :k]
                    H.append(-(p * p.log()).sum())
                    F.append(H[-1] / math.log(k))
            H_out[layer, head], F_out[layer, head] = torch.stack(H).mean(), torch.stack(F).mean()
    return H_out, F_out


def nan_from_zero_log_zero(weights, mask):
    H = -(weights * weights.log()).sum(-1)
    valid = mask[None, :, None, :].float()
    ln_n = torch.log(mask.sum(1).float())[None, :, None, None]
    return ((H * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3)),
            (H / ln_n * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3)))


def _from_rows(H, mask, valid=None, ln_n=None):
    valid = mask[None, :, None, :].float() if valid is None else valid
    ln_n = torch.log(mask.sum(1).float())[None, :, None, None] if ln_n is None else ln_n
    return ((H * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3)),
            (H / ln_n * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3)))


def over_queries(weights, mask):
    return _from_rows(-torch.xlogy(weights, weights).sum(-2), mask)


def no_minus(weights, mask):
    return _from_rows(torch.xlogy(weights, weights).sum(-1), mask)


def in_bits(weights, mask):
    return _from_rows(-(torch.xlogy(weights, weights) / math.log(2)).sum(-1), mask)


def padding_rows_too(weights, mask):
    H = -torch.xlogy(weights, weights).sum(-1)
    return _from_rows(H, mask, valid=torch.ones_like(H))


def padded_length_ceiling(weights, mask):
    H = -torch.xlogy(weights, weights).sum(-1)
    return _from_rows(H, mask, ln_n=math.log(mask.shape[1]))


def ratio_of_means(weights, mask):
    H = -torch.xlogy(weights, weights).sum(-1)
    valid = mask[None, :, None, :].float()
    mean_H = (H * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3))
    ln_n = torch.log(mask.sum(1).float())[None, :, None, None].expand_as(H)
    mean_ln_n = (ln_n * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3))
    return mean_H, mean_H / mean_ln_n


ENTROPY_WRONG = [
    (nan_from_zero_log_zero, "0 * log 0"),
    (over_queries, "sum over the keys"),
    (no_minus, "minus sign"),
    (in_bits, "nats"),
    (padding_rows_too, "padding queries"),
    (padded_length_ceiling, "REAL tokens"),
    (ratio_of_means, "its own sentence"),
    (lambda w, m: entropy_reference(w, m)[0], "returned 1 value"),
]


def test_entropy_checker_accepts_correct_answers():
    assert ex.check_head_entropy(entropy_reference)
    assert ex.check_head_entropy(entropy_loop)
    assert ex.check_head_entropy(entropy_grid)


@pytest.mark.parametrize("wrong, named", ENTROPY_WRONG,
                         ids=[getattr(w, "__name__", "one_output") for w, _ in ENTROPY_WRONG])
def test_entropy_checker_names_the_mistake(wrong, named):
    verdict = ex.check_head_entropy(wrong)
    assert not verdict
    assert verdict.message.startswith("Not yet")
    assert named in verdict.message, verdict.message


# --- stubs and hints ----------------------------------------------------------------------------


def stub(weights, mask):
    raise NotImplementedError("write this function")


@pytest.mark.parametrize("checker, what", [(ex.check_previous_token_scores, "previous_token_scores"),
                                           (ex.check_head_entropy, "head_entropy")])
def test_a_stub_is_not_implemented_yet_and_nothing_more(checker, what):
    verdict = checker(stub)
    assert not verdict and verdict.message == f"{what} is not implemented yet."


def test_a_crash_is_reported_with_its_case():
    verdict = ex.check_previous_token_scores(lambda w, m: w[..., 99])
    assert not verdict and "IndexError" in verdict.message and "case 1 of 4" in verdict.message
    assert not ex.check_head_entropy("not a function")


@pytest.mark.parametrize("name", sorted(ex.HINTS))
def test_hints_come_in_three_levels(name, capsys):
    texts = []
    for level in (1, 2, 3):
        hint(f"real_model.{name}", level)
        texts.append(capsys.readouterr().out)
    assert len(set(texts)) == 3 and all(f"Hint {k} of 3" in t for k, t in enumerate(texts, 1))
