"""Notebook 01's checkers (``exercises.rnn_bottleneck``): the references pass and agree with the
notebook's model, a stub is "not implemented yet" and nothing more, and every plausible wrong
answer is rejected with a message that names the mistake."""

from __future__ import annotations

import pytest
import torch
from _exercises import assert_rejected, assert_skeleton, stub

from attn_helpers import AdditiveScore
from attn_helpers.exercises import rnn_bottleneck as ex

# --- exercise 1: the recurrent encoder ----------------------------------------------------------


def rnn(x, W_x, W_h, b):  # noqa: N803
    h = x.new_zeros(*x.shape[:-2], W_h.shape[0])
    states = []
    for t in range(x.shape[-2]):
        h = torch.tanh(x[..., t, :] @ W_x + h @ W_h + b)
        states.append(h)
    return torch.stack(states, dim=-2), h


def test_rnn_encoder_reference_equals_torch_rnn():
    """The reference is ``torch.nn.RNN`` (tanh, batch_first) with ``W_x = weight_ih_l0.T``,
    ``W_h = weight_hh_l0.T`` and ``b = bias_ih_l0 + bias_hh_l0``."""
    torch.manual_seed(0)
    layer = torch.nn.RNN(3, 5, batch_first=True)
    x = torch.randn(4, 7, 3)
    expected_H, expected_h = layer(x)
    H, h_n = ex.rnn_encoder_reference(x, layer.weight_ih_l0.T, layer.weight_hh_l0.T,
                                      layer.bias_ih_l0 + layer.bias_hh_l0)
    assert torch.allclose(H, expected_H, atol=1e-6) and torch.allclose(h_n, expected_h[0], atol=1e-6)


def with_torch_rnn(x, W_x, W_h, b):  # noqa: N803
    layer = torch.nn.RNN(W_x.shape[0], W_x.shape[1], batch_first=True, dtype=x.dtype)
    with torch.no_grad():
        layer.weight_ih_l0.copy_(W_x.T)
        layer.weight_hh_l0.copy_(W_h.T)
        layer.bias_ih_l0.copy_(b)
        layer.bias_hh_l0.zero_()
        flat = x.reshape(-1, *x.shape[-2:])
        H, h = layer(flat)
    return H.reshape(*x.shape[:-1], -1), h[0].reshape(*x.shape[:-2], -1)


def test_rnn_encoder_accepts_right_answers():
    for right in (rnn, lambda *a: tuple(t.clone() for t in rnn(*a))):
        result = ex.check_rnn_encoder(right)
        assert result and result.message.startswith("Passed"), result.message


def test_rnn_encoder_stub_says_only_not_implemented():
    assert ex.check_rnn_encoder(stub).message == "rnn_encoder is not implemented yet."


def variant(step=lambda x_t, h, W_x, W_h, b: torch.tanh(x_t @ W_x + h @ W_h + b), *,  # noqa: N803
            order=lambda n: range(n), start=False, final=lambda H, h: h):
    def wrong(x, W_x, W_h, b):  # noqa: N803
        h = x.new_zeros(*x.shape[:-2], W_h.shape[0])
        states = {}
        for t in order(x.shape[-2]):
            before = h
            h = step(x[..., t, :], h, W_x, W_h, b)
            states[t] = before if start else h
        H = torch.stack([states[t] for t in range(x.shape[-2])], dim=-2)  # noqa: N806
        return H, final(H, h)
    return wrong


@pytest.mark.parametrize("wrong, fragments", [
    (variant(lambda x_t, h, W_x, W_h, b: x_t @ W_x + h @ W_h + b), ["tanh is missing"]),
    (variant(lambda x_t, h, W_x, W_h, b: torch.tanh(x_t @ W_x + b)), ["no recurrence"]),
    (variant(lambda x_t, h, W_x, W_h, b: torch.tanh(x_t @ W_x + h @ W_h)), ["bias b is missing"]),
    (variant(lambda x_t, h, W_x, W_h, b: torch.tanh(x_t @ W_x + h @ W_h.T + b)),
     ["W_h is transposed"]),
    (variant(order=lambda n: range(n - 1, -1, -1)), ["backwards"]),
    (variant(start=True), ["shifted by one"]),
    (variant(final=lambda H, h: H[..., 0, :]), ["h_last is the first state"]),
    (variant(final=lambda H, h: H.mean(-2)), ["mean of the states"]),
    (lambda x, W_x, W_h, b: rnn(x, W_x, W_h, b)[0], ["returned 1 value(s); expected 2"]),
    (lambda x, W_x, W_h, b: rnn(x.reshape(-1, *x.shape[-2:]), W_x, W_h, b),   # loses batch dims
     ["case 4 of 6", "shape (6, 4, 3)"]),
])
def test_rnn_encoder_rejects_and_names_mistakes(wrong, fragments):
    assert_rejected(ex.check_rnn_encoder(wrong), *fragments)


# --- exercise 2: the additive score ------------------------------------------------------------


def scores(s, H, U_q, U_k, v_a):  # noqa: N803
    return torch.tanh((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a


def test_additive_reference_is_the_notebooks_scorer():
    """The reference equals ``ah.AdditiveScore`` (the scorer in notebook 01's model) with
    ``U_q = w_q.weight.T``, ``U_k = w_k.weight.T``, ``v_a = w_v.weight[0]``."""
    torch.manual_seed(0)
    scorer = AdditiveScore(4, 6, 5)
    s, H = torch.randn(3, 4), torch.randn(3, 7, 6)
    expected = scorer(s[:, None, :], H)[:, 0, :]
    got = ex.additive_scores_reference(s, H, scorer.w_q.weight.T, scorer.w_k.weight.T,
                                       scorer.w_v.weight[0])
    assert got.shape == (3, 7) and torch.allclose(got, expected, atol=1e-6)


def test_additive_scores_accepts_right_answers():
    def with_loops(s, H, U_q, U_k, v_a):  # noqa: N803
        return torch.stack([torch.stack([torch.tanh(s[i] @ U_q + h @ U_k) @ v_a for h in H[i]])
                            for i in range(len(s))])

    for right in (scores, with_loops):
        result = ex.check_additive_scores(right)
        assert result and result.message.startswith("Passed"), result.message
    assert ex.check_additive_scores(ex.additive_scores_reference, solution=True)


def test_additive_scores_stub_says_only_not_implemented():
    assert ex.check_additive_scores(stub).message == "additive_scores is not implemented yet."


@pytest.mark.parametrize("wrong, fragments", [
    (lambda s, H, U_q, U_k, v_a: ((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a, ["tanh is missing"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh(((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a),
     ["tanh comes before v_a"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_q).unsqueeze(1) * (H @ U_k)) @ v_a,
     ["multiplied the two projections"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh(H @ U_k) @ v_a, ["decoder state s_t is missing"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_k).unsqueeze(1) + H @ U_q) @ v_a,
     ["U_q and U_k are swapped"]),
    (lambda s, H, U_q, U_k, v_a: torch.relu((s @ U_q).unsqueeze(1) + H @ U_k) @ v_a, ["ReLU"]),
    (lambda s, H, U_q, U_k, v_a: scores(s, H, U_q, U_k, v_a).softmax(-1), ["after a softmax"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh(s @ U_q + H @ U_k) @ v_a,        # no axis for j
     ["new axis for the positions j", "case 1 of 5"]),
    (lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_q).unsqueeze(1) + H @ U_k),
     ["shape (2, 5, 3)", "shape (2, 5)"]),
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


def test_the_missing_new_axis_is_named_not_a_raw_broadcasting_error():
    def no_axis(s, H, U_q, U_k, v_a):  # noqa: N803
        return torch.tanh(s @ U_q + H @ U_k) @ v_a

    result = ex.check_additive_scores(no_axis)
    assert_rejected(result, "Hint: ", "new axis")
    assert "RuntimeError" not in result.message


def test_the_written_out_reference_equals_the_cores_additive_scores():
    import attn_helpers as ah

    case = ex._additive_cases()[0]
    s, H, U_q, U_k, v_a = case.values()
    core = ah.additive_scores(s[:, None, :], H, U_q.T, U_k.T, v_a)[:, 0, :]
    torch.testing.assert_close(ex.additive_scores_reference(**case), core)


def test_a_float32_start_state_on_float64_inputs_is_named():
    """Review 4: a zero start state made without the inputs' dtype gave a bare RuntimeError."""
    def encoder(x, W_x, W_h, b):  # noqa: N803
        h = torch.zeros(*x.shape[:-2], W_h.shape[0])                      # float32 always
        states = []
        for j in range(x.shape[-2]):
            h = torch.tanh(x[..., j, :] @ W_x + h @ W_h + b)
            states.append(h)
        return torch.stack(states, dim=-2), h

    assert_rejected(ex.check_rnn_encoder(encoder), "the dtypes do not match",
                    "with the inputs' dtype")
