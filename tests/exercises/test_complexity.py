"""The checkers of notebook 08 (``exercises.complexity``): each accepts the reference, an
independent learner's solution and its level-3 hint, rejects plausible wrong answers with a message
that names the mistake, and blocks the package functions that would do the exercise. The
references are checked against the package, PyTorch's attention and autograd."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _exercises import assert_rejected, skeleton
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_helpers as ah
from attn_helpers import efficient as eff
from attn_helpers.exercises import complexity as ex
from attn_helpers.exercises import hint
from attn_helpers.exercises.workflow import EXERCISES

CHECKERS = [(ex.check_merge_states, "merge_states", "complexity.merge_states"),
            (ex.check_causal_backward_tile, "causal_backward_tile", "complexity.causal_backward_tile"),
            (ex.check_linear_step, "linear_step", "complexity.linear_step")]
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
    for ours, package in zip((m, l, acc), eff.merge_states(a, b), strict=True):
        torch.testing.assert_close(ours, package)


def learner_merge(m1, l1, acc1, m2, l2, acc2, *, new_max="max", rescale=(True, True), flip=False,
                  swap=False, finish=False, raw_exp=False):
    """A learner's merge through weights w_i = exp(m_i - m); each keyword plants one mistake."""
    m = {"max": torch.max(m1, m2), "first": m1, "min": torch.min(m1, m2)}[new_max]
    if raw_exp:                                                      # exp(m_i) / exp(m): overflows
        w1, w2 = m1.exp() / m.exp(), m2.exp() / m.exp()
    else:
        m_ = torch.where(torch.isfinite(m), m, 0.0)                  # 0 where both are empty
        w1, w2 = ((m_ - m1).exp(), (m_ - m2).exp()) if flip else ((m1 - m_).exp(), (m2 - m_).exp())
    if swap:
        w1, w2 = w2, w1
    l = w1 * l1 + w2 * l2 if rescale[0] else l1 + l2  # noqa: E741
    acc = torch.addcmul(w2 * acc2, w1, acc1) if rescale[1] else acc1 + acc2
    return m, l, acc / l if finish else acc


def test_merge_checker_accepts_the_reference_a_learner_solution_and_the_hint():
    assert ex.check_merge_states(ex.merge_states_reference, solution=True)
    verdict = ex.check_merge_states(learner_merge)
    assert verdict and verdict.message.endswith("on all 7 cases, edge cases included.")
    signature = "m1, l1, acc1, m2, l2, acc2"
    assert ex.check_merge_states(skeleton("complexity.merge_states", signature, (
        "torch.where(torch.isfinite(m), m, torch.zeros_like(m))",
        "torch.exp(m1 - safe), torch.exp(m2 - safe)", "c1 * l1 + c2 * l2",
        "c1 * acc1 + c2 * acc2")))


def test_merge_checker_names_the_nan_of_two_empty_states():
    def unsafe(m1, l1, acc1, m2, l2, acc2):
        m = torch.maximum(m1, m2)
        c1, c2 = torch.exp(m1 - m), torch.exp(m2 - m)
        return m, c1 * l1 + c2 * l2, c1 * acc1 + c2 * acc2

    verdict = ex.check_merge_states(unsafe)
    assert_rejected(verdict, "both states are empty in some rows")
    assert "case 7 of 7" in verdict.message


def _merge(**mistake):
    return lambda *args: learner_merge(*args, **mistake)


MERGE_WRONG = {
    "the sums were added without rescaling": _merge(rescale=(False, False)),
    "l was rescaled but acc was not": _merge(rescale=(True, False)),
    "the factors are upside down": _merge(flip=True),
    "the factors were swapped": _merge(swap=True),
    "m was kept from state 1": _merge(new_max="first"),
    "m is the smaller of the two maxima": _merge(new_max="min"),
    "acc came back divided by l": _merge(finish=True),
    "exp of a max near 1000 overflows": _merge(raw_exp=True),
}


@pytest.mark.parametrize("phrase", MERGE_WRONG)
def test_merge_checker_names_the_mistake(phrase):
    assert_rejected(ex.check_merge_states(MERGE_WRONG[phrase]), phrase)


def test_merge_cases_cover_the_edge_cases():
    cases = ex._merge_cases() + ex._large_merge_cases() + ex._empty_merge_cases()
    assert any(c["m1"].dim() == 4 for c in cases)                                # batch, heads
    assert any(c["m1"].shape[-2] == 1 for c in cases)                            # one query
    assert any(torch.isinf(c["m2"]).all() for c in cases)                        # an empty split
    both_ways = [((c["m1"] > c["m2"]).any() and (c["m2"] > c["m1"]).any()) for c in cases]
    assert sum(both_ways) >= 3                                                   # either max wins
    assert cases[-2]["m1"].min() > 709                                           # exp(m) overflows
    assert (torch.isinf(cases[-1]["m1"]) & torch.isinf(cases[-1]["m2"])).any()   # both empty


# --- exercise 2: one tile of the causal backward ----------------------------------------------


@settings(max_examples=20, deadline=None, derandomize=True)
@given(n=st.integers(1, 10), b_q=st.integers(1, 4), b_k=st.integers(1, 4), d=st.integers(1, 5),
       d_v=st.integers(1, 4), seed=st.integers(0, 1000))
def test_causal_tiles_over_every_tile_give_autograd(n, b_q, b_k, d, d_v, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, n, d, generator=g, dtype=F64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, n, d_v, generator=g, dtype=F64, requires_grad=True)
    d_out = torch.randn(2, n, d_v, generator=g, dtype=F64)
    out, lse = eff.tiled_attention(q, k, v, causal=True, return_lse=True)
    out.backward(d_out)
    lse, D = lse.detach().unsqueeze(-1), (d_out * out.detach()).sum(-1, keepdim=True)
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    for i in range(0, n, b_q):
        for j in range(0, n, b_k):
            I, J = slice(i, i + b_q), slice(j, j + b_k)
            a, b, c = ex.causal_backward_tile_reference(q.detach()[:, I], k.detach()[:, J],
                                                        v.detach()[:, J], d_out[:, I], lse[:, I],
                                                        D[:, I], i, j)
            dq[:, I] += a
            dk[:, J] += b
            dv[:, J] += c
    torch.testing.assert_close(dq, q.grad)
    torch.testing.assert_close(dk, k.grad)
    torch.testing.assert_close(dv, v.grad)


GIVEN_POSITIONS = ("rows = torch.arange(i, i + q_i.shape[-2])[:, None]\n"
                   "cols = torch.arange(j, j + k_j.shape[-2])[None, :]\n")


def learner_causal(q_i, k_j, v_j, d_out_i, lse_i, D_i, i, j, *, mask="causal", fill=-math.inf,
                   mask_ds_only=False, tile_d=False, scale_grads=True, raw_exp=False,
                   local_softmax=False):
    """A learner's causal tile written with einsum; each keyword plants one mistake."""
    b_q, b_k = q_i.shape[-2], k_j.shape[-2]
    rows, cols = torch.arange(b_q)[:, None] + i, torch.arange(b_k)[None, :] + j
    allowed = {"causal": cols <= rows, "none": torch.ones(b_q, b_k, dtype=torch.bool),
               "strict": cols < rows, "inverted": cols > rows}[mask]
    scale = q_i.shape[-1] ** -0.5
    s = torch.einsum("...qd,...kd->...qk", q_i, k_j) * scale
    if not mask_ds_only:
        s = torch.where(allowed, s, torch.tensor(fill, dtype=s.dtype))
    p = s.exp() / lse_i.exp() if raw_exp else (s - lse_i).exp()
    if local_softmax:                                                    # this tile's keys only
        p = torch.nan_to_num(torch.softmax(s, -1))
    dp = torch.einsum("...qv,...kv->...qk", d_out_i, v_j)
    D = (p * dp * allowed).sum(-1, keepdim=True) if tile_d else D_i
    ds = p * (dp - D)
    if mask_ds_only:
        ds = ds * allowed
    g = scale if scale_grads else 1.0
    return (torch.einsum("...qk,...kd->...qd", ds, k_j) * g,
            torch.einsum("...qk,...qd->...kd", ds, q_i) * g,
            torch.einsum("...qk,...qv->...kv", p, d_out_i))


def test_causal_checker_accepts_the_reference_a_learner_solution_and_the_hint():
    assert ex.check_causal_backward_tile(ex.causal_backward_tile_reference, solution=True)
    verdict = ex.check_causal_backward_tile(learner_causal)
    assert verdict and verdict.message.endswith("on all 7 cases, edge cases included.")
    assert ex.check_causal_backward_tile(skeleton(
        "complexity.causal_backward_tile", "q_i, k_j, v_j, d_out_i, lse_i, D_i, i, j", (
            "j >= i + q_i.shape[-2]",
            "cols <= rows",
            "dS @ k_j * scale", "dS.mT @ q_i * scale", "P.mT @ d_out_i"),
        prefix=GIVEN_POSITIONS, math=math, torch=torch))


def _causal(**mistake):
    return lambda *args: learner_causal(*args, **mistake)


CAUSAL_WRONG = {
    "no causal mask": _causal(mask="none"),
    "the diagonal was masked": _causal(mask="strict"),
    "the mask is inverted": _causal(mask="inverted"),
    "the masked scores were set to 0, not -inf": _causal(fill=0.0),
    "dS was masked but P was not": _causal(mask_ds_only=True),
    "D was recomputed as rowsum(P * dP) over this tile alone": _causal(tile_d=True),
    "dq_i and dk_j miss the scale": _causal(scale_grads=False),
    "exp(S) overflowed": _causal(raw_exp=True),
    "P was normalised within this tile": _causal(local_softmax=True),
}


@pytest.mark.parametrize("phrase", CAUSAL_WRONG)
def test_causal_checker_names_the_mistake(phrase):
    assert_rejected(ex.check_causal_backward_tile(CAUSAL_WRONG[phrase]), phrase)


def test_causal_cases_cover_the_edge_cases():
    cases = ex._causal_cases() + ex._large_causal_cases()
    kinds = set()
    for c in cases:
        b_q, b_k = c["q_i"].shape[-2], c["k_j"].shape[-2]
        kinds.add("above" if c["j"] >= c["i"] + b_q else "below" if c["j"] + b_k - 1 <= c["i"]
                  else "crossing")
        if b_q != b_k and c["i"] != c["j"]:
            kinds.add("unaligned")
    assert kinds == {"above", "below", "crossing", "unaligned"}
    assert any(c["q_i"].dim() == 4 for c in cases)
    assert any(c["q_i"].shape[-1] != c["v_j"].shape[-1] for c in cases)
    assert cases[-1]["lse_i"].min() > 709


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


def learner_step(S, z, q_t, k_t, v_t, *, phi=lambda x: F.elu(x) + 1, read_first=False,
                 normalise=True, replace=False, transpose=False, raw_z=False, phi_v=False):
    """A learner's step written with einsum; each keyword plants one mistake."""
    pq, pk = phi(q_t), phi(k_t)
    v_t = F.elu(v_t) + 1 if phi_v else v_t
    term = torch.einsum("...d,...e->...de", v_t, pk) if transpose else \
        torch.einsum("...d,...e->...de", pk, v_t)
    S_t = term if replace else S + term
    z_t = (k_t if raw_z else pk) + (0 if replace else z)
    S_r, z_r = (S, z) if read_first else (S_t, z_t)
    num = torch.einsum("...d,...de->...e", pq, S_r)
    return (num / torch.einsum("...d,...d->...", pq, z_r)[..., None] if normalise else num), S_t, z_t


def test_step_checker_accepts_the_reference_a_learner_step_and_the_hint():
    assert ex.check_linear_step(ex.linear_step_reference, solution=True)
    assert ex.check_linear_step(learner_step)
    assert ex.check_linear_step(skeleton("complexity.linear_step", "S, z, q_t, k_t, v_t", (
        "S + pk[..., :, None] * v_t[..., None, :]", "z + pk",
        "(pq[..., None, :] @ S_t).squeeze(-2) / (pq * z_t).sum(-1, keepdim=True)")))


def _step(**mistake):
    return lambda *args: learner_step(*args, **mistake)


STEP_WRONG = {
    "token t must see itself": _step(read_first=True),
    "the normaliser is missing": _step(normalise=False),
    "the state was replaced by token t's terms": _step(replace=True),
    "the outer product is transposed": _step(transpose=True),
    "z collected k_t itself": _step(raw_z=True),
    "phi = elu without the + 1": _step(phi=F.elu),
    "phi = relu": _step(phi=F.relu),
    "no feature map": _step(phi=lambda x: x),
    "phi was applied to the value too": _step(phi_v=True),
}


@pytest.mark.parametrize("phrase", STEP_WRONG)
def test_step_checker_names_the_mistake(phrase):
    assert_rejected(ex.check_linear_step(STEP_WRONG[phrase]), phrase)


# --- the package functions that would do an exercise are blocked ------------------------------


def _calls(fn_name):
    """A learner function in a notebook-like namespace that imported ``fn_name`` by name."""
    namespace = {"eff": eff, "ah": ah, "torch": torch, fn_name: getattr(eff, fn_name)}
    return namespace


def test_merge_through_the_package_or_an_imported_name_is_blocked():
    ns = _calls("merge_states")
    exec("def by_name(m1, l1, acc1, m2, l2, acc2):\n"  # noqa: S102 - test code
         "    return tuple(merge_states(eff.OnlineSoftmaxState(m1, l1, acc1),"
         " eff.OnlineSoftmaxState(m2, l2, acc2)))\n"
         "def by_step(m1, l1, acc1, m2, l2, acc2):\n"
         "    return tuple(ah.online_softmax_step(eff.OnlineSoftmaxState(m1, l1, acc1), m2, acc2))\n",
         ns)
    assert_rejected(ex.check_merge_states(ns["by_name"]), "attn_helpers.efficient.merge_states")
    assert_rejected(ex.check_merge_states(ns["by_step"]), "online_softmax_step")
    assert eff.merge_states is ns["merge_states"]                              # restored afterwards


def test_causal_tile_through_the_package_is_blocked():
    ns = _calls("backward_tile")
    exec("def f(q_i, k_j, v_j, d_out_i, lse_i, D_i, i, j):\n"  # noqa: S102 - test code
         "    return backward_tile(q_i, k_j, v_j, d_out_i, lse_i, D_i)\n", ns)
    assert_rejected(ex.check_causal_backward_tile(ns["f"]), "backward_tile")
    assert ns["backward_tile"] is eff.backward_tile


def test_linear_step_through_the_package_is_blocked():
    ns = _calls("linear_attention_step")
    exec("def f(S, z, q_t, k_t, v_t):\n"  # noqa: S102 - test code
         "    o, st = linear_attention_step(eff.LinearAttentionState(S, z), q_t, k_t, v_t)\n"
         "    return o, st.S, st.z\n"
         "def g(S, z, q_t, k_t, v_t):\n"
         "    return ah.linear_attention(q_t[..., None, :], k_t[..., None, :], v_t[..., None, :])\n", ns)
    assert_rejected(ex.check_linear_step(ns["f"]), "linear_attention_step")
    assert_rejected(ex.check_linear_step(ns["g"]), "linear_attention")
