"""Notebook 09's checkers: correct answers written several ways pass, and wrong answers written
as a learner would are rejected with a message naming the mistake."""

from __future__ import annotations

import pytest
import torch
from _exercises import skeleton

from attn_helpers.exercises import real_model as ex
from attn_helpers.lessons.real_model import offset_scores

# --- learner-style answers to exercise 1: previous_token_scores(weights, mask) -> (L, b, h) --------


def previous_reference(weights, mask):
    n = weights.shape[-1]
    i = torch.arange(1, n)
    on_previous = weights[..., i, i - 1]                       # (L, b, h, n - 1)
    valid = mask[:, 1:][None, :, None, :].float()
    return (on_previous * valid).sum(dim=3) / valid.sum(dim=3)


def previous_loop(weights, mask):  # a slow, different-looking correct answer
    L, b, h, n, _ = weights.shape
    out = torch.zeros(L, b, h)
    for layer in range(L):
        for s in range(b):
            for head in range(h):
                values = [weights[layer, s, head, i, i - 1] for i in range(1, n) if mask[s, i]]
                out[layer, s, head] = torch.stack(values).mean()
    return out


def next_token(weights, mask):
    n = weights.shape[-1]
    i = torch.arange(0, n - 1)
    valid = mask[:, 1:][None, :, None, :].float()
    return (weights[..., i, i + 1] * valid).sum(dim=3) / valid.sum(dim=3)


def own_token(weights, mask):
    valid = mask[None, :, None, :].float()
    return (weights.diagonal(dim1=-2, dim2=-1) * valid).sum(dim=3) / valid.sum(dim=3)


def with_padding(weights, mask):
    n = weights.shape[-1]
    i = torch.arange(1, n)
    return weights[..., i, i - 1].mean(dim=3)


def first_counts_as_zero(weights, mask):
    n = weights.shape[-1]
    i = torch.arange(1, n)
    on_previous = torch.cat([torch.zeros_like(weights[..., :1, 0]), weights[..., i, i - 1]], -1)
    valid = mask[None, :, None, :].float()
    return (on_previous * valid).sum(dim=3) / valid.sum(dim=3)


def wrapped_around(weights, mask):  # i = 0 .. n-1 with key i - 1: query 0 reads key -1, the last
    i = torch.arange(weights.shape[-1])
    valid = mask[None, :, None, :].float()
    return (weights[..., i, i - 1] * valid).sum(dim=3) / valid.sum(dim=3)


def clamped_at_0(weights, mask):  # key i - 1 clamped at 0: query 0 reads itself
    i = torch.arange(weights.shape[-1])
    valid = mask[None, :, None, :].float()
    return (weights[..., i, (i - 1).clamp(min=0)] * valid).sum(dim=3) / valid.sum(dim=3)


def batch_mean(weights, mask):  # per-sentence scores, then one mean over the batch for every sentence
    return previous_reference(weights, mask).mean(dim=1, keepdim=True).expand_as(
        previous_reference(weights, mask))


def all_previous(weights, mask):  # tril: every earlier key summed, not key i - 1 alone
    valid = mask[:, 1:][None, :, None, :].float()
    return (torch.tril(weights, -1).sum(-1)[..., 1:] * valid).sum(dim=3) / valid.sum(dim=3)


def summed(weights, mask):
    n = weights.shape[-1]
    i = torch.arange(1, n)
    return (weights[..., i, i - 1] * mask[:, 1:][None, :, None, :]).sum(dim=3)


def pooled_over_sentences(weights, mask):  # 4.3's score: one mean over sentences and queries
    n = weights.shape[-1]
    i = torch.arange(1, n)
    valid = mask[:, 1:][None, :, None, :].float()
    return (weights[..., i, i - 1] * valid).sum(dim=(1, 3)) / valid.sum(dim=(1, 3))


def by_n_minus_1(weights, mask):  # divided by every query i >= 1 of the padded row
    n = weights.shape[-1]
    i = torch.arange(1, n)
    return (weights[..., i, i - 1] * mask[:, 1:][None, :, None, :]).sum(dim=3) / (n - 1)


#: The stub's given lines in notebook 09: the helper ``pooled``, the mean over the last axis where
#: ``valid`` is 1.
POOLED_GIVEN = ("def pooled(x, valid):\n"
                "    return (x * valid).sum(dim=3) / valid.sum(dim=3)\n")


def validity_from_the_key(weights, mask):
    n = weights.shape[-1]
    i = torch.arange(1, n)
    valid = mask[:, :-1][None, :, None, :].float()                 # the key's, not the query's
    return (weights[..., i, i - 1] * valid).sum(dim=3) / valid.sum(dim=3)


def diagonal_next(weights, mask):  # torch.diagonal with offset +1: the diagonal above
    valid = mask[:, :-1][None, :, None, :].float()
    on = weights.diagonal(offset=1, dim1=-2, dim2=-1)               # (L, b, h, n - 1)
    return (on * valid).sum(dim=3) / valid.sum(dim=3)


def mask_without_axes(weights, mask):  # mask (b, n - 1) against entries (L, b, h, n - 1)
    i = torch.arange(1, weights.shape[-1])
    valid = mask[:, 1:].float()
    return (weights[..., i, i - 1] * valid).sum(dim=3) / valid.sum(dim=3)


PREVIOUS_WRONG = [
    (diagonal_next, "diagonal ABOVE"),
    (mask_without_axes, "where the layer and head axes go"),
    (validity_from_the_key, "validity from its key"),
    (next_token, "NEXT token"),
    (own_token, "on itself"),
    (lambda w, m: previous_reference(w.transpose(-1, -2), m), "Rows are queries"),
    (with_padding, "padding queries"),
    (first_counts_as_zero, "no previous token"),
    (wrapped_around, "wrapped around"),
    (clamped_at_0, "clamped at 0"),
    (batch_mean, "the mean over the batch"),
    (summed, "you summed"),
    (all_previous, "ALL previous tokens"),
    (lambda w, m: previous_reference(w, m)[None].expand(2, -1, -1, -1), "with shape"),  # (2, L, b, h)
    (pooled_over_sentences, "pooled over the sentences"),
    (by_n_minus_1, "divided by n - 1"),
    (lambda w, m: offset_scores(w, m, -1), "pooled over the sentences"),  # the call of 4.3
]


def test_previous_token_checker_accepts_correct_answers():
    assert ex.check_previous_token_scores(previous_reference)
    assert ex.check_previous_token_scores(previous_loop)


@pytest.mark.parametrize("wrong, named", PREVIOUS_WRONG, ids=[named for _, named in PREVIOUS_WRONG])
def test_previous_token_checker_names_the_mistake(wrong, named):
    verdict = ex.check_previous_token_scores(wrong)
    assert not verdict
    assert verdict.message.startswith("Not yet")
    assert named in verdict.message, verdict.message


# --- exercise 2: value_norms(weights, values, W_O) -> (b, h, n, n) ------------------------------


def norms_reference(weights, values, W_O):
    b, h, n, d_head = values.shape
    W_h = W_O.view(W_O.shape[0], h, d_head).permute(1, 2, 0)
    f = torch.einsum("bhjk,hkd->bhjd", values, W_h)
    return weights * f.norm(dim=-1)[:, :, None, :]


def norms_loop(weights, values, W_O):  # the definition, term by term
    b, h, n, d_head = values.shape
    out = torch.zeros_like(weights)
    for s in range(b):
        for head in range(h):
            W = W_O[:, head * d_head:(head + 1) * d_head]
            for i in range(n):
                for j in range(n):
                    term = weights[s, head, i, j] * (W @ values[s, head, j])
                    out[s, head, i, j] = torch.linalg.norm(term)
    return out


def _norms(weights, f):
    return weights * f.norm(dim=-1)[:, :, None, :]


def _f(values, W_O):  # f_h(x_j), (b, h, n, d), as the reference computes it
    W_h = W_O.view(len(W_O), values.shape[1], -1).permute(1, 2, 0)      # (h, d_head, d)
    return torch.einsum("bhjk,hkd->bhjd", values, W_h)


def value_only(weights, values, W_O):
    return _norms(weights, values)


def rows_of_W_O(weights, values, W_O):
    b, h, n, d_head = values.shape
    return _norms(weights, torch.einsum("bhjk,hkd->bhjd", values, W_O[: h * d_head].view(h, d_head, -1)))


def transposed_W_O(weights, values, W_O):  # W_O.T's rows are W_O's columns: also right
    W_h = W_O.T.reshape(values.shape[1], values.shape[-1], -1)          # (h, d_head, d)
    return _norms(weights, torch.einsum("bhjk,hkd->bhjd", values, W_h))


def interleaved_heads(weights, values, W_O):  # head h took every h-th column of W_O
    W = W_O.view(len(W_O), values.shape[-1], -1)                       # (d, d_head, h)
    return _norms(weights, torch.einsum("bhjk,dkh->bhjd", values, W))


def whole_W_O_on_head_0(weights, values, W_O):
    return _norms(weights, values @ W_O[:, :values.shape[-1]].T)


def norm_product(weights, values, W_O):  # ||v_j|| ||W_O^(h)||_F, a Cauchy-Schwarz upper bound
    W_h = W_O.view(len(W_O), values.shape[1], -1)                        # (d, h, d_head)
    return _norms(weights, values.norm(dim=-1, keepdim=True) * W_h.norm(dim=(0, 2))[:, None, None])


def no_weight(weights, values, W_O):
    return _f(values, W_O).norm(dim=-1)[:, :, None, :].expand_as(weights)


def squared(weights, values, W_O):
    return norms_reference(weights, values, W_O) ** 2 / weights.clamp_min(1e-30)


def query_norm(weights, values, W_O):
    return weights * _f(values, W_O).norm(dim=-1)[:, :, :, None]


def norm_of_output(weights, values, W_O):  # the norm of the head's whole output for query i
    return (weights @ _f(values, W_O)).norm(dim=-1)[..., None].expand_as(weights)


def merged_heads(weights, values, W_O):  # heads merged, then the whole W_O: one norm per key
    b, h, n, d_head = values.shape
    f = values.transpose(1, 2).reshape(b, n, h * d_head) @ W_O.T        # (b, n, d)
    return weights * f.norm(dim=-1)[:, None, None, :]


def row_shares(weights, values, W_O):  # each row divided by its sum: the shares of 4.4
    x = norms_reference(weights, values, W_O)
    return x / x.sum(dim=-1, keepdim=True)


NORMS_WRONG = [
    (row_shares, "divided each row by its sum"),
    (merged_heads, "merged the heads"),
    (value_only, "through the head's block"),
    (rows_of_W_O, "COLUMNS"),
    (whole_W_O_on_head_0, "first head's columns"),
    (interleaved_heads, "every h-th column"),
    (norm_product, "multiplied the two norms"),
    (no_weight, "without the attention weight"),
    (squared, "squared norm"),
    (query_norm, "QUERY"),
    (norm_of_output, "weighted SUM"),
]


def test_norms_checker_accepts_correct_answers():
    assert ex.check_value_norms(norms_reference)
    assert ex.check_value_norms(norms_loop)
    assert ex.check_value_norms(transposed_W_O)


@pytest.mark.parametrize("wrong, named", NORMS_WRONG, ids=[w.__name__ for w, _ in NORMS_WRONG])
def test_norms_checker_names_the_mistake(wrong, named):
    verdict = ex.check_value_norms(wrong)
    assert not verdict
    assert verdict.message.startswith("Not yet")
    assert named in verdict.message, verdict.message


# --- stubs and hints ----------------------------------------------------------------------------


def stub(*args):
    raise NotImplementedError("write this function")


def test_a_stub_is_not_implemented_yet_and_a_crash_is_reported_with_its_case():
    assert ex.check_value_norms(stub).message == "value_norms is not implemented yet."
    verdict = ex.check_previous_token_scores(lambda w, m: w[..., 99])
    assert not verdict and "IndexError" in verdict.message and "case 1 of 4" in verdict.message


def test_the_level_3_skeletons_filled_in_pass():
    previous = skeleton("real_model.previous_token", "weights, mask", (
        "weights[..., i, i - 1]", "mask[:, 1:][None, :, None, :].float()"), prefix=POOLED_GIVEN)
    assert ex.check_previous_token_scores(previous)
    norms = skeleton("real_model.value_norms", "weights, values, W_O", (
        "W_O.view(W_O.shape[0], h, d_head).permute(1, 2, 0)",
        "torch.einsum('bhjk,hkd->bhjd', values, W_h)", "weights * f.norm(dim=-1)[:, :, None, :]"))
    assert ex.check_value_norms(norms)


def untransposed_block(weights, values, W_O):      # head h's columns (d, d_head), not transposed
    h, d_head = values.shape[1], values.shape[-1]
    f = torch.stack([values[:, k] @ W_O[:, k * d_head:(k + 1) * d_head] for k in range(h)], dim=1)
    return weights * f.norm(dim=-1)[:, :, None, :]


def norm_over_keys(weights, values, W_O):          # the norm over the keys' axis, not over d
    b, h, n, d_head = values.shape
    f = torch.einsum("bhjk,hkd->bhjd", values, W_O.view(len(W_O), h, d_head).permute(1, 2, 0))
    return weights * f.norm(dim=-2)[:, :, None, :]


@pytest.mark.parametrize("wrong, named", [(untransposed_block, "transpose them"),
                                          (norm_over_keys, "over the last axis, d")])
def test_norms_checker_turns_shape_errors_into_hints(wrong, named):
    verdict = ex.check_value_norms(wrong)
    assert not verdict and "Hint:" in verdict.message and named in verdict.message, verdict.message
