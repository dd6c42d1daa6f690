"""Notebook 01's checkers: the references match torch and the model; every named mistake is named."""

from __future__ import annotations

import pytest
import torch
from _exercises import assert_rejected, assert_skeleton

from attn_helpers import AdditiveScore
from attn_helpers.exercises import rnn_bottleneck as ex


def rnn(x, W_x, W_h, b, one_batch_dim=False, dtype=True, detach=False):  # noqa: N803
    batch = x.shape[:1 if one_batch_dim else -2]
    h = torch.zeros(*batch, W_h.shape[0], dtype=x.dtype if dtype else None)
    states = []
    for t in range(x.shape[-2]):                         # detach: right values, no gradient through time
        previous = h.detach() if detach else h
        h = torch.tanh((x[:, t] if one_batch_dim else x[..., t, :]) @ W_x + previous @ W_h + b)
        states.append(h)
    return torch.stack(states, dim=-2), h


def scores(s, H, U_q, U_k, v_a):  # noqa: N803
    return torch.tanh((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a


def test_rnn_encoder_reference_equals_torch_rnn():
    """``W_x = weight_ih_l0.T``, ``W_h = weight_hh_l0.T``, ``b = bias_ih_l0 + bias_hh_l0``."""
    torch.manual_seed(0)
    layer = torch.nn.RNN(3, 5, batch_first=True)
    x = torch.randn(4, 7, 3)
    expected_H, expected_h = layer(x)
    H, h_n = ex.rnn_encoder_reference(x, layer.weight_ih_l0.T, layer.weight_hh_l0.T,
                                      layer.bias_ih_l0 + layer.bias_hh_l0)
    assert torch.allclose(H, expected_H, atol=1e-6) and torch.allclose(h_n, expected_h[0], atol=1e-6)


def test_additive_reference_is_the_notebooks_scorer():
    """``AdditiveScore`` with ``U_q = w_q.weight.T``, ``U_k = w_k.weight.T``, ``v_a = w_v.weight[0]``."""
    torch.manual_seed(0)
    scorer = AdditiveScore(4, 6, 5)
    s, H = torch.randn(3, 4), torch.randn(3, 7, 6)
    expected = scorer(s[:, None, :], H)[:, 0, :]
    got = ex.additive_scores_reference(s, H, scorer.w_q.weight.T, scorer.w_k.weight.T,
                                       scorer.w_v.weight[0])
    assert got.shape == (3, 7) and torch.allclose(got, expected, atol=1e-6)


def test_right_answers_pass():
    def with_loops(s, H, U_q, U_k, v_a):  # noqa: N803
        return torch.stack([torch.stack([torch.tanh(s[i] @ U_q + h @ U_k) @ v_a for h in H[i]])
                            for i in range(len(s))])

    def with_torch_rnn(x, W_x, W_h, b):  # noqa: N803  (the course accepts any correct way)
        layer = torch.nn.RNN(*W_x.shape, batch_first=True).to(x.dtype)
        with torch.no_grad():
            for weight, value in [(layer.weight_ih_l0, W_x.T), (layer.weight_hh_l0, W_h.T),
                                  (layer.bias_ih_l0, b), (layer.bias_hh_l0, 0 * b)]:
                weight.copy_(value)
        H, h = layer(x.reshape(-1, *x.shape[-2:]))   # noqa: N806
        return H.reshape(*x.shape[:-1], -1), h[0].reshape(*x.shape[:-2], -1)

    for check, right in [(ex.check_rnn_encoder, rnn), (ex.check_rnn_encoder, with_torch_rnn),
                         (ex.check_rnn_encoder, lambda *a: tuple(t.clone() for t in rnn(*a))),
                         (ex.check_additive_scores, scores), (ex.check_additive_scores, with_loops)]:
        result = check(right)
        assert result and result.message.startswith("Passed"), result.message


@pytest.mark.parametrize("check, mistake", [
    *((ex.check_rnn_encoder, m) for m in ex.RNN_MISTAKES),
    *((ex.check_additive_scores, m) for m in ex.ADDITIVE_MISTAKES)])
def test_every_named_mistake_is_rejected_with_its_hint(check, mistake):
    assert_rejected(check(mistake.produce), "Hint: " + mistake.hint)


def aliased(x, W_x, W_h, b):  # noqa: N803
    """One state tensor written in place each step and appended n times."""
    h = torch.zeros(*x.shape[:-2], W_h.shape[0], dtype=x.dtype)
    states = []
    for j in range(x.shape[-2]):
        h[...] = torch.tanh(x[..., j, :] @ W_x + h @ W_h + b)
        states.append(h)
    return torch.stack(states, dim=-2), h


R, A = ex.check_rnn_encoder, ex.check_additive_scores


@pytest.mark.parametrize("check, wrong, fragments", [          # as a learner writes them
    (R, lambda *a: rnn(*a, dtype=False), ["the dtypes do not match", "with the inputs' dtype"]),
    (R, lambda *a: tuple(t.float() for t in rnn(*a)),                       # a float32 answer
     ["case 4 of 6", "as torch.float32", "is torch.float64"]),
    (R, lambda *a: rnn(*a)[0], ["returned 1 value(s); expected 2"]),
    (R, lambda x, *w: rnn(x.reshape(-1, *x.shape[-2:]), *w), ["case 4 of 6", "shape (6, 4, 3)"]),
    (R, lambda *a: rnn(*a, one_batch_dim=True), ["case 4 of 6", "Hint: ", "x[..., j, :]"]),  # x[:, j]
    (R, lambda *a: (torch.stack(list(rnn(*a)[0].unbind(-2)), dim=1), rnn(*a)[1]),  # one batch dim
     ["case 4 of 6", "stacked on dim 1", "on dim -2"]),
    (R, aliased, ["every state in H equals the last one", "in place", "h = torch.tanh(...)"]),
    (R, lambda *a: rnn(*a, detach=True), ["right values", "gradient into x", "h_{j-1} detached"]),
    (R, lambda x, W_x, W_h, b: rnn(x, W_h, W_x, b), ["case 1 of 6", "Hint: ", "W_x and W_h swapped"]),
    (A, lambda *a: scores(*a).float(), ["case 4 of 5", "as torch.float32", "is torch.float64"]),
    (A, lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_q).unsqueeze(1) + H @ U_k),
     ["shape (2, 5, 3)", "shape (2, 5)"]),
    (A, lambda s, H, U_q, U_k, v_a: v_a @ torch.tanh((s @ U_q).unsqueeze(1) + H @ U_k),    # raises
     ["case 1 of 5", "Hint: v_a on the left", "Put v_a on the right"]),
    (A, lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_q).unsqueeze(1) + H @ U_k.T) @ v_a,  # d_a != d_h
     ["Hint: ", "inner sizes must agree", "need no transpose"]),
    (A, lambda s, H, q, k, v: (torch.tanh((s @ q).unsqueeze(1) + H @ k) * v).sum(-1, keepdim=True),
     ["(b, n, 1)", "return (b, n)"]),
])
def test_learner_style_mistakes_are_named(check, wrong, fragments):
    assert_rejected(check(wrong), *fragments)


@pytest.mark.parametrize("key, signature, check, fills", [
    ("rnn_bottleneck.rnn_encoder", "x, W_x, W_h, b", ex.check_rnn_encoder,
     ("torch.tanh(x[..., j, :] @ W_x + h @ W_h + b)",)),
    ("rnn_bottleneck.additive_scores", "s, H, U_q, U_k, v_a", ex.check_additive_scores,
     ("(s @ U_q)[:, None, :]", "features @ v_a")),
])
def test_the_third_hint_is_a_skeleton_that_passes_once_its_key_lines_are_written(
        key, signature, check, fills):
    assert_skeleton(key, signature, check, fills)
