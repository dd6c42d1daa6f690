"""Notebook 08's checkers accept the reference, a learner's solution and the level-3 hint, and name
each plausible mistake. The references are checked against PyTorch's attention and autograd."""

from __future__ import annotations

import math
import re
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from _exercises import assert_rejected, skeleton
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_helpers as ah
from attn_helpers import efficient as eff
from attn_helpers.exercises import EXERCISES
from attn_helpers.exercises import complexity as ex

F64 = torch.float64


# --- exercise 1: merge two partial states ------------------------------------------------------


@settings(max_examples=25, deadline=None, derandomize=True)
@given(n_q=st.integers(1, 6), n_1=st.integers(1, 6), n_2=st.integers(1, 6), d_v=st.integers(1, 4),
       shift=st.floats(-20, 20), seed=st.integers(0, 1000))
def test_merged_states_of_two_key_sets_give_attention_over_both(n_q, n_1, n_2, d_v, shift, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(2, n_q, n_1 + n_2, generator=g, dtype=F64)
    s[..., n_1:] += shift
    v = torch.randn(2, n_1 + n_2, d_v, generator=g, dtype=F64)
    a, b = eff.block_state(s[..., :n_1], v[:, :n_1]), eff.block_state(s[..., n_1:], v[:, n_1:])
    m, l, acc = ex.merge_states_reference(*a, *b)
    torch.testing.assert_close(acc / l, torch.softmax(s, -1) @ v)
    torch.testing.assert_close(m, s.amax(-1, keepdim=True))


def learner_merge(m1, l1, acc1, m2, l2, acc2, *, new_max="max", rescale=("12", "12"), flip=False,
                  swap=False, finish=False, raw_exp=False, weigh=False, safe=True, average=False):
    """A learner's merge through weights w_i = exp(m_i - m); each keyword plants one mistake."""
    m = {"max": torch.max(m1, m2), "first": m1, "smaller": torch.min(m1, m2), "mean": (m1 + m2) / 2,
         "lse": torch.logaddexp(m1 + l1.log(), m2 + l2.log()),                # log-domain: l = 1
         "zero": torch.where(torch.max(m1, m2).isfinite(), torch.max(m1, m2), 0.0)}[new_max]
    if raw_exp:                                                      # exp(m_i) / exp(m): overflows
        w1, w2 = m1.exp() / m.exp(), m2.exp() / m.exp()
        w1, w2 = (w1.nan_to_num(0.0), w2.nan_to_num(0.0)) if raw_exp == "masked" else (w1, w2)
    else:
        m_ = torch.where(torch.isfinite(m), m, 0.0) if safe else m   # 0 where both are empty
        w1, w2 = ((m_ - m1).exp(), (m_ - m2).exp()) if flip else ((m1 - m_).exp(), (m2 - m_).exp())
    w1, w2 = (w2, w1) if swap else (w1, w2)
    def weights(states):                          # rescale the states named in states, keep the others
        return [w if name in states else torch.ones_like(w) for name, w in (("1", w1), ("2", w2))]
    (a1, a2), (b1, b2) = weights(rescale[0]), weights(rescale[1])
    l, acc = a1 * l1 + a2 * l2, torch.addcmul(b2 * acc2, b1, acc1)  # noqa: E741
    acc = (w1 * l1 * acc1 + w2 * l2 * acc2) / l if weigh else acc
    acc = (acc1 / l1 + acc2 / l2) * l / 2 if average else acc          # the normalised outputs' mean
    return m, l, acc / l if finish else acc


MERGE_FILLS = ("torch.where(torch.isfinite(m), m, torch.zeros_like(m))",
               "torch.exp(m1 - safe), torch.exp(m2 - safe)", "c1 * l1 + c2 * l2",
               "c1 * acc1 + c2 * acc2")


def test_merge_checker_accepts_the_reference_a_learner_solution_and_the_hint():
    assert ex.check_merge_states(ex.merge_states_reference, solution=True)
    verdict = ex.check_merge_states(learner_merge)
    assert verdict and verdict.message.endswith("on all 7 cases, edge cases included.")
    assert ex.check_merge_states(skeleton("complexity.merge_states", "m1, l1, acc1, m2, l2, acc2",
                                          MERGE_FILLS))


MERGE_WRONG = {
    "both states are empty in some rows": partial(learner_merge, safe=False),
    "the sums were added without rescaling": partial(learner_merge, rescale=("", "")),
    "l was rescaled but acc was not": partial(learner_merge, rescale=("12", "")),
    "acc was rescaled on one side only": partial(learner_merge, rescale=("12", "1")),
    **{f"only state {i} was rescaled": partial(learner_merge, rescale=(i, i)) for i in "12"},
    "the factors are upside down": partial(learner_merge, flip=True),
    "the factors were swapped": partial(learner_merge, swap=True),
    "m was kept from state 1": partial(learner_merge, new_max="first"),
    **{f"m is the {w} of m1 and m2": partial(learner_merge, new_max=w) for w in ("smaller", "mean")},
    "acc came back divided by l": partial(learner_merge, finish=True),
    "exp of a max near 1000 overflows": partial(learner_merge, raw_exp=True),
    "this case has maxima near 1000": partial(learner_merge, raw_exp="masked"),  # inf / inf -> 0: finite
    "acc was weighted by l": partial(learner_merge, weigh=True),
    "acc is l times the mean of the normalised outputs": partial(learner_merge, average=True),
    "rows with no key in either state came back with m = 0": partial(learner_merge, new_max="zero"),
    "m is the running max, not the log-sum-exp": partial(learner_merge, new_max="lse"),
    "return (m, l, acc)": lambda *a: learner_merge(*a)[::-1],                        # (acc, l, m)
    "the merged max, sum and output sum": lambda *a: [learner_merge(*a)[i] for i in (1, 0, 2)],
}


@pytest.mark.parametrize("phrase", MERGE_WRONG)
def test_merge_checker_names_the_mistake(phrase):
    verdict = ex.check_merge_states(MERGE_WRONG[phrase])
    assert_rejected(verdict, phrase)
    assert verdict.message.count("Hint:") == 1, verdict.message      # a case's hint never doubles one


def test_no_overflow_hint_where_the_large_case_raises():
    def fails_at_the_large_case(m1, *rest):                  # raises there: no values to explain
        if m1.max() > 500:
            raise RuntimeError("no")
        return learner_merge(m1, *rest)

    raised = ex.check_merge_states(fails_at_the_large_case)
    assert "case 6 of 7" in raised.message and "Hint:" not in raised.message, raised.message


# --- exercise 2: the causal backward, in tiles -------------------------------------------------


BACKWARD_ARGS = "q, k, v, O, lse, d_out, B"


def _autograd(case):
    leaves = [case[x].clone().requires_grad_() for x in "qkv"]
    out = ah.scaled_dot_product_attention(*leaves, ah.causal_mask(case["q"].shape[-2]))[0]
    out.backward(case["d_out"])
    return out.detach(), [leaf.grad for leaf in leaves]


def test_the_backward_reference_equals_autograd_through_causal_attention_on_every_case():
    for case in ex._cases():
        out, grads = _autograd(case)
        torch.testing.assert_close(out, case["O"])
        _, lse = eff.tiled_attention(case["q"], case["k"], case["v"], causal=True, return_lse=True)
        torch.testing.assert_close(case["lse"], lse)                  # as the forward saves it
        for ours, theirs in zip(ex.causal_backward_reference(*case.values()), grads, strict=True):
            torch.testing.assert_close(ours, theirs, atol=1e-9, rtol=1e-9)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(n=st.integers(1, 11), B=st.integers(1, 5), d_k=st.integers(1, 4), d_v=st.integers(1, 4),
       seed=st.integers(0, 1000))
def test_the_backward_reference_equals_autograd_for_any_n_and_B(n, B, d_k, d_v, seed):
    g = torch.Generator().manual_seed(seed)
    case = ex._case(g, (2,), n, d_k, d_v, B)
    _, grads = _autograd(case)
    for ours, theirs in zip(ex.causal_backward_reference(*case.values()), grads, strict=True):
        torch.testing.assert_close(ours, theirs)


def learner_backward(q, k, v, O, lse, d_out, B, *, visit="causal", mask="causal", fill=-math.inf,
                     mask_ds_only=False, tile_d=False, local_softmax=False, scale=(True, True),
                     score_pow=1, assign=(), raw_exp=False, no_lse=False, lse_keys=False, d_keys=False,
                     no_d=False, dv_o=False, dv_ds=False, whole_tiles=False, scale_v=False):
    """A learner's backward: query tiles outside, einsum, triu masks; each keyword plants a mistake."""
    n, c = q.shape[-2], (v if scale_v else q).shape[-1] ** -0.5
    D = torch.einsum("...nv,...nv->...n", d_out, O)
    D = D if d_keys else D[..., None]
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    tiles = n // B if whole_tiles else math.ceil(n / B)                # whole_tiles: drops the short one
    for i in range(0, tiles * B, B):
        Q, dO = q[..., i:i + B, :], d_out[..., i:i + B, :]
        b_q = Q.shape[-2]
        L = lse[..., i:i + B][..., None, :] if lse_keys else lse[..., i:i + B, None]
        for j in range(0, tiles * B, B):
            if {"causal": j > i + b_q - 1, "all": False, "below": j > i - 1}[visit]:
                continue
            K, V = k[..., j:j + B, :], v[..., j:j + B, :]
            offset = torch.ones(b_q, K.shape[-2], dtype=torch.bool)        # key j + b vs query i + a
            allowed = {"causal": ~offset.triu(i - j + 1), "strict": ~offset.triu(i - j),
                       "inverted": offset.triu(i - j + 1), "none": offset,
                       "local": ~offset.triu(1)}[mask]                  # the tile's tril, from 0
            s = torch.einsum("...qd,...kd->...qk", Q, K) * c ** score_pow
            masked = torch.where(allowed, s, torch.tensor(fill, dtype=s.dtype))
            p = (masked if not mask_ds_only else s)
            p = p.exp() / lse[..., i:i + B, None].exp() if raw_exp else (p - (0 if no_lse else L)).exp()
            p = torch.nan_to_num(torch.softmax(masked, -1)) if local_softmax else p
            dp = torch.einsum("...qv,...kv->...qk", dO, V)
            D_i = (D[..., i:i + B][..., None, :] if d_keys else D[..., i:i + B, :])
            D_i = (p * dp * allowed).sum(-1, keepdim=True) if tile_d else D_i
            ds = p * (dp - D_i) if not no_d else p * dp
            ds = torch.where(allowed, ds, 0.0) if mask_ds_only else ds
            c_q, c_k = (c if scaled else 1.0 for scaled in scale)
            shares = {"dq": (dq, slice(i, i + B), torch.einsum("...qk,...kd->...qd", ds, K) * c_q),
                      "dk": (dk, slice(j, j + B), torch.einsum("...qk,...qd->...kd", ds, Q) * c_k),
                      "dv": (dv, slice(j, j + B), torch.einsum("...qk,...qv->...kv", ds if dv_ds else p,
                                                               O[..., i:i + B, :] if dv_o else dO))}
            for name, (grad, where, share) in shares.items():
                grad[..., where, :] = share if name in assign else grad[..., where, :] + share
    return dq, dk, dv


HINT_FILLS = ("(d_out * O).sum(-1, keepdim=True)", "j, n, B",
              "(Q_i @ K_j.mT * scale).masked_fill(cols > rows, -math.inf)",
              "torch.exp(S - lse[..., i:i + B, :])",
              "dS @ K_j * scale", "dS.mT @ Q_i * scale", "P.mT @ dO_i")


def test_backward_checker_accepts_the_reference_a_learner_solution_and_the_hint():
    assert ex.check_causal_backward(ex.causal_backward_reference, solution=True)
    verdict = ex.check_causal_backward(learner_backward)
    assert verdict and verdict.message.endswith("on all 6 cases, edge cases included.")
    assert not ex.check_causal_backward(skeleton("complexity.causal_backward", BACKWARD_ARGS))
    assert ex.check_causal_backward(skeleton("complexity.causal_backward", BACKWARD_ARGS, HINT_FILLS))


@pytest.mark.parametrize("key, fragments", [
    ("merge_states", ("exp(m1 - m)", "exp(m2 - m)", "exp(m_i - m)", "subtract 0", "torch.")),
    ("causal_backward", ("rowsum", "exp(", "+=", "sqrt", "masked_fill"))])
def test_hints_before_the_skeleton_do_not_state_the_solution(key, fragments):
    hints = EXERCISES[f"complexity.{key}"].hints
    assert not [fragment for fragment in fragments if fragment in hints[0] + hints[1]]


BROADCAST = (lambda a, b: (a[..., :, None, :] * b[..., None, :, :]).sum(-1),     # S = Q K^T
             lambda a, b: (a[..., :, :, None] * b[..., None, :, :]).sum(-2),     # dQ = dS K
             lambda a, b: (a[..., :, :, None] * b[..., :, None, :]).sum(-3))     # dK = dS^T Q


def variant_backward(q, k, v, O, lse, d_out, B, *, prescale=False, clone=False, broadcast=False,
                     dv_first=False, d_per_tile=False, scores_twice=False, mask_after_exp=False,
                     sized_by_B=False):
    """A right causal backward, each keyword one legitimate change: q scaled once, q and k cloned,
    products by broadcasting ((..., B, B, d)), dV first, D per tile, S twice, P zeroed after exp;
    except ``sized_by_B``: the positions of a short last tile taken from B (wrong unless B divides n)."""
    n, c = q.shape[-2], q.shape[-1] ** -0.5
    q, k = (q.clone(), k.clone()) if clone else (q, k)
    q, c_s, c_k = (q * c, 1.0, 1.0) if prescale else (q, c, c)      # scaled once, or in S and dK
    nt, nn, tn = BROADCAST if broadcast else (lambda a, b: a @ b.mT, torch.matmul, lambda a, b: a.mT @ b)
    D = (d_out * O).sum(-1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j in range(0, n, B):
        for i in range(j, n, B):
            I, J = slice(i, i + B), slice(j, j + B)
            Q, K, V, dO = q[..., I, :], k[..., J, :], v[..., J, :], d_out[..., I, :]
            ends = (i + B, j + B) if sized_by_B else (min(i + B, n), min(j + B, n))
            rows, cols = torch.arange(i, ends[0])[:, None], torch.arange(j, ends[1])
            S = nt(Q, K) * c_s
            S = nt(Q, K) * c_s if scores_twice else S
            L = lse[..., I, None]
            P = (torch.where(cols <= rows, torch.exp(S - L), 0.0) if mask_after_exp
                 else torch.exp(S.masked_fill(cols > rows, -math.inf) - L))
            if dv_first:
                dv[..., J, :] += tn(P, dO)
            D_i = (dO * O[..., I, :]).sum(-1, keepdim=True) if d_per_tile else D[..., I, :]
            dS = P * (nt(dO, V) - D_i)
            dq[..., I, :] += nn(dS, K) * c
            dk[..., J, :] += tn(dS, Q) * c_k
            if not dv_first:
                dv[..., J, :] += tn(P, dO)
    return dq, dk, dv


LEGIT = [{}, {"prescale": True}, {"clone": True}, {"prescale": True, "clone": True},
         {"broadcast": True, "prescale": True}, {"dv_first": True}, {"mask_after_exp": True},
         {"d_per_tile": True}, {"scores_twice": True, "d_per_tile": True}]


@pytest.mark.parametrize("keywords", LEGIT, ids=lambda kw: "-".join(kw) or "plain")
def test_the_backward_checker_accepts_right_answers_written_other_ways(keywords):
    verdict = ex.check_causal_backward(partial(variant_backward, **keywords))
    assert verdict, verdict.message


BACKWARD_WRONG = {
    "the tiles that cross the diagonal were not masked": dict(mask="none"),
    "the diagonal tiles were skipped": dict(visit="below"),
    "the diagonal was masked": dict(mask="strict"), "the mask is inverted": dict(mask="inverted"),
    "the mask was built from the tile's own indices": dict(mask="local"),
    "the masked scores were set to 0, not -inf": dict(fill=0.0),
    "misses its second term": dict(no_d=True), "dV_j was built from O": dict(dv_o=True),
    "dS was masked but P was not": dict(mask_ds_only=True),
    "D was recomputed as rowsum(P * dP) over one tile": dict(tile_d=True),
    "P was normalised within the tile": dict(local_softmax=True),
    "P = exp(S) without the lse": dict(no_lse=True), "exp(S) overflowed": dict(raw_exp=True),
    "lse broadcast along the keys": dict(lse_keys=True), "D broadcast along the keys": dict(d_keys=True),
    "the scores miss the scale": dict(score_pow=0), "the scores were scaled twice": dict(score_pow=2),
    "the scale used d_v": dict(scale_v=True),
    "dq or dk misses the scale": dict(scale=(False, False)), "or from dS": dict(dv_ds=True),
    "dq or dk misses the scale: S = Q K^T": dict(scale=(True, False)),
    "dK_j or dV_j was assigned in each query tile, not added": dict(assign=("dk", "dv")),
    "the last query tile overwrote the others": dict(assign=("dv",)),
    "dQ_i was assigned in each key tile, not added": dict(assign=("dq",)),
    "the short last tile was dropped": dict(whole_tiles=True),
}


@pytest.mark.parametrize("phrase, mistake", BACKWARD_WRONG.items())
def test_backward_checker_names_the_mistake(phrase, mistake):
    assert_rejected(ex.check_causal_backward(partial(learner_backward, **mistake)), phrase)


def full_matrix(q, k, v, O, lse, d_out, B):
    """Right, but it holds the whole (n, n) score matrix."""
    S = (q @ k.mT / math.sqrt(q.shape[-1])).masked_fill(~ah.causal_mask(q.shape[-2]), -math.inf)
    P = torch.exp(S - lse[..., None])
    dS = P * (d_out @ v.mT - (d_out * O).sum(-1, keepdim=True))
    return dS @ k / math.sqrt(q.shape[-1]), dS.mT @ q / math.sqrt(q.shape[-1]), P.mT @ d_out


def untiled_queries(q, k, v, O, lse, d_out, B):
    """Right, but like section 4's loop: all n queries against each key tile, (..., n, B)."""
    n, c = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    D, L = (d_out * O).sum(-1, keepdim=True), lse[..., None]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    rows = torch.arange(n)[:, None]
    for j in range(0, n, B):
        K, V, cols = k[..., j:j + B, :], v[..., j:j + B, :], torch.arange(j, min(j + B, n))
        P = torch.exp((q @ K.mT * c).masked_fill(cols > rows, -math.inf) - L)
        dS = P * (d_out @ V.mT - D)
        dq += dS @ K * c
        dk[..., j:j + B, :] = dS.mT @ q * c
        dv[..., j:j + B, :] = P.mT @ d_out
    return dq, dk, dv


def through_sdpa(q, k, v, O, lse, d_out, B):        # right, by autograd through torch's fused call
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    return torch.autograd.grad(F.scaled_dot_product_attention(*leaves, is_causal=True), leaves, d_out)


@pytest.mark.parametrize("backward, what, why", [
    (full_matrix, "shape (16, 16)", "never to hold the n x n matrix"),
    (untiled_queries, "shape (16, 4)", "the queries were not tiled"),
    (through_sdpa, "called scaled_dot_product_attention", "cannot see what a fused call holds"),
    (partial(learner_backward, visit="all"), "queries 0..3 against keys 4..7", "wholly above the diag")])
def test_the_backward_checker_refuses_more_than_the_tiles_need(backward, what, why):
    case = ex._cases()[1]                                     # right numbers: only the tiling is wrong
    for ours, theirs in zip(backward(*case.values()), ex.causal_backward_reference(*case.values()),
                            strict=True):
        torch.testing.assert_close(ours, theirs)
    assert_rejected(ex.check_causal_backward(backward), "case 1 of 6", what, why)


def test_the_backward_checker_names_a_last_tile_sized_by_B_and_accepts_padding():
    tile_of_B = partial(variant_backward, sized_by_B=True)
    assert_rejected(ex.check_causal_backward(tile_of_B), "case 2 of 6", "the last tile is shorter")

    def padded(q, k, v, O, lse, d_out, B):                    # pad n to a multiple of B, then cut
        n, pad = q.shape[-2], -q.shape[-2] % B
        grads = tile_of_B(*(F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, O)), F.pad(lse, (0, pad)),
                          F.pad(d_out, (0, 0, 0, pad)), B)
        return tuple(g[..., :n, :] for g in grads)

    assert ex.check_causal_backward(padded)


# --- exercise 3: one step of causal linear attention -------------------------------------------


def test_linear_steps_equal_causal_linear_attention_and_the_package_step():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 11, d, generator=g, dtype=F64) for d in (4, 4, 3))
    S, z, outs, state = torch.zeros(2, 4, 3, dtype=F64), torch.zeros(2, 4, dtype=F64), [], None
    for t in range(11):
        o, S, z = ex.linear_step_reference(S, z, q[:, t], k[:, t], v[:, t])
        o_pkg, state = eff.linear_attention_step(state, q[:, t], k[:, t], v[:, t])
        torch.testing.assert_close(o, o_pkg)
        outs.append(o)
    torch.testing.assert_close(torch.stack(outs, 1), eff.linear_attention(q, k, v, causal=True))


def learner_step(S, z, q_t, k_t, v_t, *, phi=lambda x: F.elu(x) + 1, read_first=False, outer=False,
                 normalise=True, replace=False, transpose=False, z_term="phi_k", phi_v=False, eps=0.0,
                 old_z=False, z_by="q", s_side=False, keepdim=True, phi_k=True, softmax=False):
    """A learner's step written with einsum; each keyword plants one mistake."""
    pq, pk = phi(q_t), phi(k_t) if phi_k else k_t
    v_t = F.elu(v_t) + 1 if phi_v else v_t
    term = torch.einsum("...d,...e->...de", *((v_t, pk) if transpose else (pk, v_t)))
    term, pq = torch.outer(pk, v_t) if outer else term, pq.softmax(-1) if softmax else pq
    S_t = term if replace else S + term
    z_t = {"phi_k": pk, "k": k_t, "phi_q": pq}[z_term] + (0 if replace else z)
    S_r, z_r = (S, z) if read_first else (S_t, z if old_z else z_t)
    side = ("...de,...e->...d", S_r, pq) if s_side is True else ("...d,...de->...e", pq, S_r)
    num = torch.einsum(*side)
    num = (S_r @ pq[..., :, None]).squeeze(-1) if s_side == "matmul" else num
    den = torch.einsum("...d,...d->...", {"q": pq, "k": pk, "1": pq ** 0}[z_by], z_r)
    den = (den[..., None] if keepdim else den) + eps
    return (num / den if normalise else num), S_t, z_t


def test_step_checker_accepts_the_reference_a_learner_step_and_the_hint():
    assert ex.check_linear_step(ex.linear_step_reference, solution=True)
    assert ex.check_linear_step(learner_step)
    assert ex.check_linear_step(skeleton("complexity.linear_step", "S, z, q_t, k_t, v_t", (
        "S + pk[..., :, None] * v_t[..., None, :]", "z + pk",
        "(pq[..., None, :] @ S_t).squeeze(-2) / (pq * z_t).sum(-1, keepdim=True)")))


@pytest.mark.parametrize("eps", [1e-9, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3])
def test_step_checker_accepts_the_usual_eps_in_the_normaliser_and_names_a_larger_one(eps):
    verdict = ex.check_linear_step(partial(learner_step, eps=eps))
    assert bool(verdict) == (eps <= 1e-6)
    if not verdict:                                 # the values it prints differ where eps moved them
        assert_rejected(verdict, f"an eps of {eps:g} in the normaliser")
        gave, expected = re.search(r"you gave (\S+), expected (\S+) \(", verdict.message).groups()
        assert gave != expected, verdict.message


STEP_WRONG = {
    "token t must see itself": partial(learner_step, read_first=True),
    "the normaliser used z before token t was added": partial(learner_step, old_z=True),
    "the normaliser is missing": partial(learner_step, normalise=False),
    "the normaliser was read with phi(k_t)": partial(learner_step, z_by="k"),
    "the normaliser summed z_t alone": partial(learner_step, z_by="1"),
    "the state was replaced by token t's terms": partial(learner_step, replace=True),
    "the outer product is transposed": partial(learner_step, transpose=True),        # raises: d_k != d_v
    "S was read from the wrong side": partial(learner_step, s_side=True),            # raises: d_k != d_v
    "S was read from the wrong side: S is": partial(learner_step, s_side="matmul"),  # (4x3 and 4x1)
    "z collected k_t itself": partial(learner_step, z_term="k"),
    "z collected phi(q_t)": partial(learner_step, z_term="phi_q"),
    "phi = elu without the + 1": partial(learner_step, phi=F.elu),
    "phi = relu": partial(learner_step, phi=F.relu), "phi = exp": partial(learner_step, phi=torch.exp),
    "no feature map": partial(learner_step, phi=lambda x: x),
    "phi = exp(x / sqrt(d_k))": partial(learner_step, phi=lambda x: (x * x.shape[-1] ** -0.5).exp()),
    "q_t and k_t were scaled": partial(learner_step, phi=lambda x: F.elu(x * x.shape[-1] ** -0.5) + 1),
    "phi was applied to the value too": partial(learner_step, phi_v=True),
    "phi(k_t) is missing": partial(learner_step, phi_k=False),
    "a softmax over phi(q_t)": partial(learner_step, softmax=True, normalise=False),
    "torch.outer takes 1-D vectors only": partial(learner_step, outer=True),      # raises on case 2
    "lost its summed axis: keep it (keepdim=True)": partial(learner_step, keepdim=False),  # case 2 on
    "only q_t was scaled": lambda S, z, q, k, v: learner_step(S, z, q / math.sqrt(q.shape[-1]), k, v),
    "only k_t was scaled": lambda S, z, q, k, v: learner_step(S, z, q, k / math.sqrt(k.shape[-1]), v),
    "return (o_t, S_t, z_t)": lambda *args: learner_step(*args)[::-1],             # (z_t, S_t, o_t)
    "the output first, then the new state": lambda *a: [learner_step(*a)[i] for i in (1, 2, 0)],
}


@pytest.mark.parametrize("phrase", STEP_WRONG)
def test_step_checker_names_the_mistake(phrase):
    assert_rejected(ex.check_linear_step(STEP_WRONG[phrase]), phrase)

