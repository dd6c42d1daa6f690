"""Notebook 09's checkers: correct answers pass; named and learner-written mistakes get their hint."""

from __future__ import annotations

import pytest
import torch
from _exercises import assert_rejected, skeleton, stub

from attn_helpers.exercises import real_model as ex
from attn_helpers.lessons.real_model import offset_scores

P, N = ex.check_previous_token_scores, ex.check_value_norms


@pytest.mark.parametrize("check, mistake", [*((P, m) for m in ex.PREVIOUS_MISTAKES),
                                            *((N, m) for m in ex.NORMS_MISTAKES)])
def test_every_named_mistake_is_rejected_with_its_hint(check, mistake):
    assert_rejected(check(mistake.produce), "Hint: " + mistake.hint)


# --- exercise 1: previous_token_scores(weights, mask) -> (L, b, h) ----------------------------------

def previous(weights, mask, *, key=-1, first=1, valid=None):
    """The mean of a[i, i + key] over the queries i >= first (validity: mask's, or ``valid``)."""
    i = torch.arange(first, weights.shape[-1])
    valid = (mask[:, first:] if valid is None else valid)[None, :, None, :].float()
    return (weights[..., i, i + key] * valid).sum(dim=3) / valid.sum(dim=3)


def previous_loop(weights, mask):  # a slow, different-looking correct answer
    L, b, h, n, _ = weights.shape
    out = torch.zeros(L, b, h)
    for layer in range(L):
        for s in range(b):
            for head in range(h):
                values = [weights[layer, s, head, i, i - 1] for i in range(1, n) if mask[s, i]]
                out[layer, s, head] = torch.stack(values).mean()
    return out


def test_previous_token_checker_accepts_correct_answers():
    assert P(previous) and P(previous_loop)


def next_token(weights, mask):
    i = torch.arange(0, weights.shape[-1] - 1)
    valid = mask[:, 1:][None, :, None, :].float()
    return (weights[..., i, i + 1] * valid).sum(dim=3) / valid.sum(dim=3)


def mask_without_axes(weights, mask):  # mask (b, n - 1) against entries (L, b, h, n - 1)
    i = torch.arange(1, weights.shape[-1])
    valid = mask[:, 1:].float()
    return (weights[..., i, i - 1] * valid).sum(dim=3) / valid.sum(dim=3)


@pytest.mark.parametrize("wrong, named", [
    (next_token, "NEXT token"),
    (lambda w, m: previous(w, m, valid=torch.ones_like(m[:, 1:])), "padding queries"),
    (lambda w, m: previous(w, m).transpose(0, 1), "has shape (3, 2, 3)"),      # (b, L, h) for (L, b, h)
    (lambda w, m: offset_scores(w, m, -1), "pooled over the sentences"),     # the call of 4.3
    (mask_without_axes, "case 1 of 4"),     # h != b: it fails on the first case, with the hint below
    (mask_without_axes, "Hint: the mask is (b, n - 1) but the entries"),
])
def test_previous_token_checker_names_learner_mistakes(wrong, named):
    assert_rejected(P(wrong), named)


# --- exercise 2: value_norms(weights, values, W_O) -> (b, h, n, n) ------------------------------

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


def norms(weights, values, W_h):  # W_h (h, d_head, d): head h's block of W_O as a learner built it
    return weights * torch.einsum("bhjk,hkd->bhjd", values, W_h).norm(dim=-1)[:, :, None, :]


def test_norms_checker_accepts_correct_answers():
    assert N(norms_loop)
    assert N(lambda w, v, W: norms(w, v, W.view(len(W), v.shape[1], -1).permute(1, 2, 0)))
    assert N(lambda w, v, W: norms(w, v, W.T.reshape(v.shape[1], v.shape[-1], -1)))  # W_O.T's rows


def untransposed_block(weights, values, W_O):      # head h's columns (d, d_head), not transposed
    h, d_head = values.shape[1], values.shape[-1]
    f = torch.stack([values[:, k] @ W_O[:, k * d_head:(k + 1) * d_head] for k in range(h)], dim=1)
    return weights * f.norm(dim=-1)[:, :, None, :]


def norm_over_keys(weights, values, W_O):          # the norm over the keys' axis, not over d
    b, h, n, d_head = values.shape
    f = torch.einsum("bhjk,hkd->bhjd", values, W_O.view(len(W_O), h, d_head).permute(1, 2, 0))
    return weights * f.norm(dim=-2)[:, :, None, :]


@pytest.mark.parametrize("wrong, named", [
    (untransposed_block, "Hint: a matrix product did not fit"),    # shape errors turned into hints
    (norm_over_keys, "Hint: two tensors did not broadcast"),
])
def test_norms_checker_names_learner_mistakes(wrong, named):
    assert_rejected(N(wrong), named)


# --- stubs and hints ----------------------------------------------------------------------------

def test_a_stub_is_not_implemented_yet_and_a_crash_is_reported_with_its_case():
    assert N(stub).message == "value_norms is not implemented yet."
    verdict = P(lambda w, m: w[..., 99])
    assert not verdict and "IndexError" in verdict.message and "case 1 of 4" in verdict.message


def test_the_level_3_skeletons_filled_in_pass():
    assert P(skeleton("real_model.previous_token", "weights, mask", (
        "weights[..., i, i - 1]", "mask[:, 1:][None, :, None, :].float()",
        "(on_previous * valid).sum(dim=3) / valid.sum(dim=3)")))
    assert N(skeleton("real_model.value_norms", "weights, values, W_O_weight", (
        "W_O_weight.view(W_O_weight.shape[0], h, d_head).permute(1, 2, 0)",
        "torch.einsum('bhjk,hkd->bhjd', values, W_h)", "weights * f.norm(dim=-1)[:, :, None, :]")))
