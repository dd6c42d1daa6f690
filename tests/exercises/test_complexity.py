"""The checkers of notebook 08 (``exercises.complexity``): each accepts the reference and other
correct solutions, and rejects plausible wrong answers with a message that names the mistake.
The references are checked against PyTorch's attention and autograd."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _exercises import assert_rejected, from_hint
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.exercises import complexity as ex
from attn_helpers.exercises import hint
from attn_helpers.exercises.workflow import EXERCISES

CHECKERS = [(ex.check_tile_update, "tile_update", "complexity.tile_update"),
            (ex.check_backward_tile, "backward_tile", "complexity.backward_tile"),
            (ex.check_causal_linear, "causal_linear", "complexity.causal_linear")]
F64 = torch.float64


@pytest.mark.parametrize("check, what, key", CHECKERS)
def test_a_stub_is_not_implemented_yet_and_nothing_more(check, what, key, capsys):
    def stub(*args):
        raise NotImplementedError

    assert check(stub).message == f"{what} is not implemented yet."
    assert check(lambda *args: None).message == f"{what} is not implemented yet (it returned None)."
    assert check.exercise_key == key and key in EXERCISES
    hint(key, 3)
    assert capsys.readouterr().out.startswith(f"Hint 3 of 3 for '{EXERCISES[key].title}'")


# --- the references against independent implementations --------------------------------------


def empty_state(batch, n_q, d_v):
    return (torch.full((*batch, n_q, 1), -math.inf, dtype=F64),
            torch.zeros(*batch, n_q, 1, dtype=F64), torch.zeros(*batch, n_q, d_v, dtype=F64))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(n_q=st.integers(1, 9), n_k=st.integers(1, 11), block=st.integers(1, 5), d=st.integers(1, 6),
       d_v=st.integers(1, 4), heads=st.integers(1, 3), seed=st.integers(0, 1000))
def test_tile_updates_over_every_key_tile_give_torch_attention(n_q, n_k, block, d, d_v, heads, seed):
    g = torch.Generator().manual_seed(seed)
    q = 3 * torch.randn(heads, n_q, d, generator=g, dtype=F64)
    k = 3 * torch.randn(heads, n_k, d, generator=g, dtype=F64)
    v = torch.randn(heads, n_k, d_v, generator=g, dtype=F64)
    m, l, acc = empty_state((heads,), n_q, d_v)
    for j in range(0, n_k, block):
        m, l, acc = ex.tile_update_reference(m, l, acc, q, k[:, j:j + block], v[:, j:j + block])
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    assert torch.allclose(acc / l, F.scaled_dot_product_attention(q, k, v), atol=1e-10)
    assert torch.equal(m, scores.amax(-1, keepdim=True))
    assert torch.allclose(l, torch.exp(scores - m).sum(-1, keepdim=True))


# --- exercise 1: one FlashAttention tile -------------------------------------------------------


def learner_tile(m, l, acc, q, k, v, *, scale=None, rescale=(True, True), block_max=False,
                 normalise=False, finish=False, subtract_max=True):
    """A learner's tile update written out with einsum; each keyword plants one mistake."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale(q, v)
    s = torch.einsum("...qd,...kd->...qk", q, k) * scale
    m_new = torch.maximum(m, s.max(dim=-1, keepdim=True).values)
    c = torch.exp(m - m_new)
    if subtract_max:
        p = torch.exp(s - (s.max(dim=-1, keepdim=True).values if block_max else m_new))
    else:
        p = torch.exp(s) / torch.exp(m_new)
        c = torch.exp(m) / torch.exp(m_new)
    if normalise:
        p = p / p.sum(-1, keepdim=True)
    l_new = (c * l if rescale[0] else l) + p.sum(-1, keepdim=True)
    acc_new = (c * acc if rescale[1] else acc) + torch.einsum("...qk,...kv->...qv", p, v)
    return m_new, l_new, acc_new / l_new if finish else acc_new


def test_tile_checker_accepts_the_reference_and_a_learner_solution():
    assert ex.check_tile_update(ex.tile_update_reference)
    verdict = ex.check_tile_update(learner_tile)
    assert verdict and verdict.message.endswith("on all 6 cases, edge cases included.")


def _tile(**mistake):
    return lambda *args: learner_tile(*args, **mistake)


TILE_WRONG = {
    "the scores were not scaled": _tile(scale=lambda q, v: 1.0),
    "the scores were divided by d_k": _tile(scale=lambda q, v: 1 / q.shape[-1]),
    "the scale used the values' width d_v": _tile(scale=lambda q, v: v.shape[-1] ** -0.5),
    "l was rescaled but acc was not": _tile(rescale=(True, False)),
    "neither l nor acc was rescaled": _tile(rescale=(False, False)),
    "exponentiated against its own max": _tile(block_max=True),
    "the tile's weights were normalised": _tile(normalise=True),
    "acc came back divided by l": _tile(finish=True),
    "exp of a large score overflows": _tile(subtract_max=False),
}


@pytest.mark.parametrize("phrase", TILE_WRONG)
def test_tile_checker_names_the_mistake(phrase):
    verdict = ex.check_tile_update(TILE_WRONG[phrase])
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message


def test_tile_cases_cover_the_edge_cases():
    cases = ex._tile_cases() + ex._large_tile_cases()
    assert any(c["q"].shape[-2] == 1 and c["k"].shape[-2] == 1 for c in cases)   # one token
    assert any(c["q"].dim() == 4 for c in cases)                                 # batch, heads
    assert any(torch.isinf(c["m"]).all() for c in cases)                         # a first tile
    assert any(c["q"].shape[-1] != c["v"].shape[-1] for c in cases)              # d_k != d_v
    large = cases[-1]
    scores = large["q"] @ large["k"].T / math.sqrt(8)
    assert scores.min() > 709 and large["m"].min() > 709                        # exp overflows
    assert (scores.amax(-1, keepdim=True) > large["m"]).any()                    # the max moves


# --- exercise 2: one tile of FlashAttention-2's backward --------------------------------------


@settings(max_examples=20, deadline=None, derandomize=True)
@given(n_q=st.integers(1, 8), n_k=st.integers(1, 10), block=st.integers(1, 4), d=st.integers(1, 6),
       d_v=st.integers(1, 4), seed=st.integers(0, 1000))
def test_backward_tiles_over_every_key_tile_give_autograd(n_q, n_k, block, d, d_v, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, n, d, generator=g, dtype=F64, requires_grad=True) for n in (n_q, n_k))
    v = torch.randn(2, n_k, d_v, generator=g, dtype=F64, requires_grad=True)
    d_out = torch.randn(2, n_q, d_v, generator=g, dtype=F64)
    out = F.scaled_dot_product_attention(q, k, v)
    out.backward(d_out)
    lse = torch.logsumexp(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1, keepdim=True).detach()
    D = (d_out * out.detach()).sum(-1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), [], []
    for j in range(0, n_k, block):
        a, b, c = ex.backward_tile_reference(q.detach(), k.detach()[:, j:j + block],
                                             v.detach()[:, j:j + block], d_out, lse, D)
        dq, dk, dv = dq + a, dk + [b], dv + [c]
    torch.testing.assert_close(dq, q.grad)
    torch.testing.assert_close(torch.cat(dk, 1), k.grad)
    torch.testing.assert_close(torch.cat(dv, 1), v.grad)


def learner_backward(q, k_j, v_j, d_out, lse, D, *, scale_grads=True, scale_scores=True, tile_d=False,
                     drop_d=False, add_d=False, tile_softmax=False, tile_max=False, raw_exp=False):
    """A learner's backward tile written with einsum; each keyword plants one mistake."""
    scale = q.shape[-1] ** -0.5
    s = torch.einsum("...qd,...kd->...qk", q, k_j) * (scale if scale_scores else 1.0)
    if tile_softmax:
        p = s.softmax(dim=-1)
    elif tile_max:
        p = (s - s.max(dim=-1, keepdim=True).values).exp()
    elif raw_exp:
        p = s.exp() / lse.exp()
    else:
        p = (s - lse).exp()
    dp = torch.einsum("...qv,...kv->...qk", d_out, v_j)
    if tile_d:
        D = (p * dp).sum(-1, keepdim=True)
    D = 0.0 if drop_d else -D if add_d else D
    ds = p * (dp - D)
    g = scale if scale_grads else 1.0
    return (torch.einsum("...qk,...kd->...qd", ds, k_j) * g,
            torch.einsum("...qk,...qd->...kd", ds, q) * g, torch.einsum("...qk,...qv->...kv", p, d_out))


def test_backward_checker_accepts_the_reference_a_learner_solution_and_the_hint():
    assert ex.check_backward_tile(ex.backward_tile_reference)
    assert ex.check_backward_tile(learner_backward)
    assert ex.check_backward_tile(from_hint("complexity.backward_tile",
                                            "q, k_j, v_j, d_out, lse, D", math=math))


def _backward(**mistake):
    return lambda *args: learner_backward(*args, **mistake)


BACKWARD_WRONG = {
    "D was recomputed as rowsum(P * dP) over this tile alone": _backward(tile_d=True),
    "missing the - D term": _backward(drop_d=True),
    "D was added instead of subtracted": _backward(add_d=True),
    "dq and dk_j miss the scale": _backward(scale_grads=False),
    "the scores were not scaled before exp": _backward(scale_scores=False),
    "P was not recomputed from lse: a softmax over this tile alone": _backward(tile_softmax=True),
    "against the tile's own max, not from lse": _backward(tile_max=True),
    "exp(S) overflowed": _backward(raw_exp=True),
}


@pytest.mark.parametrize("phrase", BACKWARD_WRONG)
def test_backward_checker_names_the_mistake(phrase):
    assert_rejected(ex.check_backward_tile(BACKWARD_WRONG[phrase]), phrase)


def test_backward_cases_cover_the_edge_cases():
    cases = ex._backward_cases() + ex._large_backward_cases()
    assert any(c["q"].dim() == 4 for c in cases)                                # batch, heads
    assert any(c["q"].shape[-2] == 1 and c["k_j"].shape[-2] == 1 for c in cases)
    assert any(c["q"].shape[-1] != c["v_j"].shape[-1] for c in cases)           # d_k != d_v
    for c in cases:                                   # a real tile: fewer keys than the row has
        assert (torch.logsumexp(c["q"] @ c["k_j"].mT / math.sqrt(c["q"].shape[-1]), -1, True)
                < c["lse"] - 1e-6).all()
    assert cases[-1]["lse"].min() > 709                                         # exp(S) overflows


# --- exercise 3: causal linear attention by running sums --------------------------------------


def test_causal_linear_reference_is_the_masked_quadratic_form():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 11, d, generator=g, dtype=F64) for d in (4, 4, 3))
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    a = (phi_q @ phi_k.mT).tril()                                # phi(q_t) . phi(k_j), j <= t
    torch.testing.assert_close(ex.causal_linear_reference(q, k, v), (a @ v) / a.sum(-1, keepdim=True))


def learner_linear(q, k, v, *, phi=lambda x: F.elu(x) + 1, read_first=False, lookahead=False,
                   normalise=True, full=False, full_z=False, phi_v=False):
    """A learner's causal linear attention as a loop over t; each keyword plants one mistake."""
    pq, pk = phi(q), phi(k)
    v = F.elu(v) + 1 if phi_v else v
    n = q.shape[-2]
    if full:
        S, z = torch.einsum("...jd,...je->...de", pk, v), pk.sum(-2)
    outs = []
    S_t = q.new_zeros((*q.shape[:-2], q.shape[-1], v.shape[-1]))
    z_t = q.new_zeros((*q.shape[:-2], q.shape[-1]))
    def add(S_t, z_t, t):
        return S_t + torch.einsum("...d,...e->...de", pk[..., t, :], v[..., t, :]), z_t + pk[..., t, :]

    for t in range(n):
        if not read_first:
            S_t, z_t = add(S_t, z_t, t)
        S_read, z_read = (S, z) if full else (S_t, z_t)
        if lookahead and t + 1 < n:
            S_read = S_read + torch.einsum("...d,...e->...de", pk[..., t + 1, :], v[..., t + 1, :])
            z_read = z_read + pk[..., t + 1, :]
        if full_z:
            z_read = pk.sum(-2)
        num = torch.einsum("...d,...de->...e", pq[..., t, :], S_read)
        den = (pq[..., t, :] * z_read).sum(-1, keepdim=True)
        outs.append(num / den if normalise else num)
        if read_first:
            S_t, z_t = add(S_t, z_t, t)
    return torch.stack(outs, dim=-2)


def test_causal_linear_checker_accepts_the_reference_a_learner_loop_and_the_hint():
    assert ex.check_causal_linear(ex.causal_linear_reference)
    assert ex.check_causal_linear(learner_linear)
    assert ex.check_causal_linear(from_hint("complexity.causal_linear", "q, k, v"))


def _linear(**mistake):
    return lambda *args: learner_linear(*args, **mistake)


LINEAR_WRONG = {
    "future included (non-causal)": _linear(full=True),
    "include token t + 1, from the future": _linear(lookahead=True),
    "token t does not see itself": _linear(read_first=True),
    "the normaliser is missing": _linear(normalise=False),
    "the normaliser z summed over all tokens": _linear(full_z=True),
    "phi = elu without the + 1": _linear(phi=F.elu),
    "no feature map": _linear(phi=lambda x: x),
    "phi was applied to the values too": _linear(phi_v=True),
}


@pytest.mark.parametrize("phrase", LINEAR_WRONG)
def test_causal_linear_checker_names_the_mistake(phrase):
    assert_rejected(ex.check_causal_linear(LINEAR_WRONG[phrase]), phrase)
