"""Notebook 01's checkers: the references match torch and the model; every named mistake is named."""

from __future__ import annotations

import pytest
import torch
from _exercises import assert_rejected, assert_skeleton

from attn_helpers import AdditiveScore
from attn_helpers.exercises import rnn_bottleneck as ex


def rnn(x, W_x, W_h, b, one_batch_dim=False):  # noqa: N803
    h = x.new_zeros(*x.shape[:1 if one_batch_dim else -2], W_h.shape[0])
    states = []
    for t in range(x.shape[-2]):
        h = torch.tanh((x[:, t] if one_batch_dim else x[..., t, :]) @ W_x + h @ W_h + b)
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


def variant(step=lambda x_t, h, W_x, W_h, b: torch.tanh(x_t @ W_x + h @ W_h + b), *,  # noqa: N803
            order=lambda n: range(n), start=False, final=lambda H, h: h, dtype=True, h0=0.0):
    def wrong(x, W_x, W_h, b):  # noqa: N803
        h = torch.zeros(*x.shape[:-2], W_h.shape[0], dtype=x.dtype if dtype else None) + h0
        states = {}
        for t in order(x.shape[-2]):
            before = h
            h = step(x[..., t, :], h, W_x, W_h, b)
            states[t] = before if start else h
        H = torch.stack([states[t] for t in range(x.shape[-2])], dim=-2)  # noqa: N806
        return H, final(H, h)
    return wrong


def aliased(x, W_x, W_h, b):  # noqa: N803
    """One state tensor written in place each step and appended n times."""
    h = torch.zeros(*x.shape[:-2], W_h.shape[0], dtype=x.dtype)
    states = []
    for j in range(x.shape[-2]):
        h[...] = torch.tanh(x[..., j, :] @ W_x + h @ W_h + b)
        states.append(h)
    return torch.stack(states, dim=-2), h


@pytest.mark.parametrize("wrong, fragments", [
    (variant(lambda x_t, h, W_x, W_h, b: x_t @ W_x + h @ W_h + b), ["tanh is missing"]),
    (variant(lambda x_t, h, W_x, W_h, b: torch.tanh(x_t @ W_x + b)), ["no recurrence"]),
    (variant(lambda x_t, h, W_x, W_h, b: torch.tanh(x_t @ W_x + b) + h @ W_h), ["after the tanh"]),
    (variant(lambda x_t, h, W_x, W_h, b: torch.tanh(x_t @ W_x + h @ W_h)), ["bias b is missing"]),
    (variant(lambda x_t, h, W_x, W_h, b: torch.tanh(x_t @ W_x + h @ W_h) + b), ["bias b is outside"]),
    (variant(lambda x_t, h, W_x, W_h, b: torch.tanh(x_t @ W_x + h @ W_h.T + b)),
     ["W_h is transposed"]),
    (variant(order=lambda n: range(n)[::-1]), ["backwards"]), (variant(start=True), ["shifted by one"]),
    (variant(final=lambda H, h: H[..., 0, :]), ["h_last is the first state"]),
    (variant(final=lambda H, h: H.mean(-2)), ["mean of the states"]),
    (lambda *a: (rnn(*a)[0].movedim(-2, 0), rnn(*a)[1]), ["shape (5, 2, 4)", "on dim -2"]),
    (variant(dtype=False), ["the dtypes do not match", "with the inputs' dtype"]),
    (lambda x, W_x, W_h, b: rnn(x, W_x, W_h, b)[0], ["returned 1 value(s); expected 2"]),
    (lambda x, W_x, W_h, b: rnn(x.reshape(-1, *x.shape[-2:]), W_x, W_h, b),   # loses batch dims
     ["case 4 of 6", "shape (6, 4, 3)"]),
    (lambda *a: rnn(*a, one_batch_dim=True), ["case 4 of 6", "Hint: ", "x[..., j, :]"]),  # x[:, j]
    (lambda *a: (torch.stack(list(rnn(*a)[0].unbind(-2)), dim=1), rnn(*a)[1]),   # fine for one batch dim
     ["case 4 of 6", "stacked on dim 1", "on dim -2"]),
    (variant(lambda x_t, h, W_x, W_h, b: torch.sigmoid(x_t @ W_x + h @ W_h + b)), ["sigmoid"]),
    (variant(h0=1.0), ["h_{-1} is ones", "h_{-1} = 0"]),
    (lambda x, W_x, W_h, b: rnn(x[..., 1:, :], W_x, W_h, b), ["n-1 states", "one state per token"]),
    (lambda *a: rnn(*a)[::-1], ["return order is swapped", "(H, h_last)"]),
    (variant(lambda x_t, h, W_x, W_h, b: torch.relu(x_t @ W_x + h @ W_h + b)), ["ReLU", "tanh"]),
    (aliased, ["every state in H equals the last one", "in place", "h = torch.tanh(...)"]),
    (variant(lambda x_t, h, W_x, W_h, b: torch.tanh(x_t @ W_x) + h @ W_h + b),
     ["tanh wraps only x_j W_x", "squashes the whole sum"]),
    (variant(lambda x_t, h, W_x, W_h, b: x_t @ W_x + torch.tanh(h @ W_h) + b),
     ["tanh wraps only h_{j-1} W_h;", "squashes the whole sum"]),
    (variant(lambda x_t, h, W_x, W_h, b: x_t @ W_x + torch.tanh(h @ W_h + b)),
     ["tanh wraps only h_{j-1} W_h + b", "squashes the whole sum"]),
])
def test_rnn_encoder_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_rnn_encoder(wrong), *fragments)


@pytest.mark.parametrize("wrong, fragments", [
    (lambda s, H, U_q, U_k, v_a: ((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a, ["tanh is missing"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh(((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a),
     ["tanh comes before v_a"]),
    (lambda s, H, q, k, v: torch.tanh((s @ q)[:, None] * (H @ k)) @ v, ["multiplied the two"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh(H @ U_k) @ v_a, ["decoder state s_t is missing"]),
    (lambda s, H, U_q, U_k, v_a: (torch.tanh(s @ U_q).unsqueeze(1) + torch.tanh(H @ U_k)) @ v_a,
     ["each projection separately", "weights ignore s_t"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_k).unsqueeze(1) + H @ U_q) @ v_a,
     ["U_q and U_k are swapped"]),
    (lambda s, H, U_q, U_k, v_a: torch.relu((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a, ["ReLU"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_q)[:, None] + H @ U_k).sum(-1), ["v_a is missing"]),
    (lambda s, H, U_q, U_k, v_a: scores(s, H, U_q, U_k, v_a).softmax(-1), ["after a softmax"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh(s @ U_q + H @ U_k) @ v_a,        # no axis for j
     ["Hint: ", "new axis for the positions j", "case 1 of 5"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_q).unsqueeze(1) + H @ U_k),
     ["shape (2, 5, 3)", "shape (2, 5)"]),
    (lambda s, H, U_q, U_k, v_a: scores(s, H, U_q, U_k, v_a) / U_q.shape[1] ** 0.5,
     ["divided by sqrt(d_a)", "no scale"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh(((s @ U_q).unsqueeze(1) + H @ U_k) / len(v_a) ** 0.5) @ v_a,
     ["sqrt(d_a) inside the tanh"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_q).unsqueeze(1) + H @ U_k.T) @ v_a,   # d_a != d_h
     ["Hint: ", "inner sizes must agree", "need no transpose"]),
    (lambda s, H, q, k, v: (torch.tanh((s @ q).unsqueeze(1) + H @ k) * v).sum(-1, keepdim=True),
     ["(b, n, 1)", "return (b, n)"]),
    (lambda s, H, U_q, U_k, v_a: scores(s, H, U_q, U_k, v_a).softmax(0), ["softmax over dim 0"]),
    (lambda s, H, U_q, U_k, v_a: torch.sigmoid((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a, ["sigmoid"]),
    (lambda s, H, U_q, U_k, v_a: v_a @ torch.tanh((s @ U_q).unsqueeze(1) + H @ U_k),    # raises
     ["case 1 of 5", "Hint: if v_a stands on the left", "Put v_a on the right"]),
    (lambda s, H, U_q, U_k, v_a: torch.einsum("bd,bnd->bn", s, H), ["dot-product score", "Luong"]),
    (lambda s, H, q, k, v: torch.einsum("ba,bna->bn", s @ q, H @ k), ["dot product of the projections"]),
    (lambda s, H, U_q, U_k, v_a: scores(s, H, U_q, U_k, v_a).exp(), ["exponentiated"]),
    (lambda s, H, U_q, U_k, v_a: scores(s, H, U_q, U_k, v_a).log_softmax(-1), ["log_softmax"]),
])
def test_additive_scores_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_additive_scores(wrong), *fragments)


@pytest.mark.parametrize("key, signature, check, fills", [
    ("rnn_bottleneck.rnn_encoder", "x, W_x, W_h, b", ex.check_rnn_encoder,
     ("torch.tanh(x[..., j, :] @ W_x + h @ W_h + b)",)),
    ("rnn_bottleneck.additive_scores", "s, H, U_q, U_k, v_a", ex.check_additive_scores,
     ("(s @ U_q)[:, None, :]", "features @ v_a")),
])
def test_the_third_hint_is_a_skeleton_that_passes_once_its_key_lines_are_written(
        key, signature, check, fills):
    assert_skeleton(key, signature, check, fills)
