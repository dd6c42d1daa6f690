"""The checkers of notebook 08 (``exercises.complexity``): each accepts the reference and other
correct solutions, and rejects plausible wrong answers with a message that names the mistake.
The references are checked against PyTorch's attention, the softmax and real tensor sizes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_helpers.exercises import complexity as ex
from attn_helpers.exercises import hint
from attn_helpers.exercises.workflow import EXERCISES

CHECKERS = [(ex.check_tile_update, "tile_update", "complexity.tile_update"),
            (ex.check_merge_states, "merge_states", "complexity.merge_states"),
            (ex.check_kv_cache_bytes, "kv_cache_bytes", "complexity.kv_cache_bytes")]
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


@settings(max_examples=25, deadline=None, derandomize=True)
@given(n_q=st.integers(1, 6), n_a=st.integers(1, 6), n_b=st.integers(1, 6), d_v=st.integers(1, 4),
       size=st.sampled_from([1.0, 10.0, 400.0]), seed=st.integers(0, 1000))
def test_merging_two_blocks_gives_the_softmax_over_both(n_q, n_a, n_b, d_v, size, seed):
    g = torch.Generator().manual_seed(seed)
    scores = size * torch.randn(2, n_q, n_a + n_b, generator=g, dtype=F64)   # 400: exp overflows
    values = torch.randn(2, n_a + n_b, d_v, generator=g, dtype=F64)
    a = ex._state_after(scores[..., :n_a], values[:, :n_a])
    b = ex._state_after(scores[..., n_a:], values[:, n_a:])
    m, l, acc = ex.merge_states_reference(*a, *b)
    assert torch.isfinite(l).all() and torch.isfinite(acc).all()
    assert torch.equal(m, scores.amax(-1, keepdim=True))
    assert torch.allclose(acc / l, torch.softmax(scores, dim=-1) @ values, atol=1e-10)
    assert torch.allclose(ex.merge_states_reference(*b, *a)[2], acc)            # either order


def test_merging_rows_that_saw_no_key():
    m, l, acc = ex.merge_states_reference(*empty_state((), 2, 3), *empty_state((), 2, 3))
    assert torch.equal(m, torch.full((2, 1), -math.inf, dtype=F64))
    assert (l == 0).all() and (acc == 0).all()
    a = ex._state_after(torch.tensor([[0.5, 2.0]], dtype=F64), torch.eye(2, dtype=F64))
    merged = ex.merge_states_reference(*a, *empty_state((), 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(merged, a, strict=True))


@pytest.mark.parametrize("model", [ex.KV_MODELS[0], ex.KV_MODELS[-1], (7, 3, 4, 2, 16, torch.bfloat16)])
def test_kv_cache_bytes_are_the_bytes_of_the_cached_tensors(model):
    n, layers, heads, kv_heads, head_dim, dtype = model
    keys_and_values = [torch.empty(2, kv_heads, n, head_dim, dtype=dtype) for _ in range(layers)]
    assert ex.kv_cache_bytes_reference(*model) == sum(t.nbytes for t in keys_and_values)


def test_kv_cache_bytes_of_llama_3_8b_at_8192_tokens_are_one_gib():
    assert ex.kv_cache_bytes_reference(*ex.KV_MODELS[2]) == 2**30


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


# --- exercise 2: merging two blocks' states ----------------------------------------------------


def learner_merge(m_a, l_a, acc_a, m_b, l_b, acc_b, *, guard=True, factors=None, combine=None):
    """A learner's merge; each keyword plants one mistake."""
    m = torch.maximum(m_a, m_b)
    ref = torch.where(torch.isinf(m), torch.zeros_like(m), m) if guard else m
    ca, cb = (torch.exp(m_a - ref), torch.exp(m_b - ref)) if factors is None else factors(
        m_a, m_b, m)
    if combine is not None:
        return combine(m, ca, cb, l_a, acc_a, l_b, acc_b)
    return m, ca * l_a + cb * l_b, ca * acc_a + cb * acc_b


def test_merge_checker_accepts_the_reference_and_a_learner_solution():
    assert ex.check_merge_states(ex.merge_states_reference)
    verdict = ex.check_merge_states(learner_merge)
    assert verdict and verdict.message.endswith("on all 8 cases, edge cases included.")


def _merge(**mistake):
    return lambda *args: learner_merge(*args, **mistake)


MERGE_WRONG = {
    "l and acc were added as they are": _merge(factors=lambda a, b, m: (1.0, 1.0)),
    "only b was rescaled": _merge(factors=lambda a, b, m: (1.0, torch.exp(b - m))),
    "the factors are upside down": _merge(factors=lambda a, b, m: (torch.exp(m - a),
                                                                  torch.exp(m - b))),
    "the larger of the two maxima": lambda m_a, l_a, acc_a, m_b, l_b, acc_b: (
        torch.minimum(m_a, m_b), *learner_merge(m_a, l_a, acc_a, m_b, l_b, acc_b)[1:]),
    "acc came back divided by l": _merge(combine=lambda m, ca, cb, l_a, acc_a, l_b, acc_b: (
        m, ca * l_a + cb * l_b, (ca * acc_a + cb * acc_b) / (ca * l_a + cb * l_b))),
    "outputs were averaged": _merge(combine=lambda m, ca, cb, l_a, acc_a, l_b, acc_b: (
        m, (l_a + l_b) / 2, (acc_a / l_a + acc_b / l_b) / 2)),
    "overflowed exp": _merge(factors=lambda a, b, m: (torch.exp(a) / torch.exp(m),
                                                     torch.exp(b) / torch.exp(m))),
    "exp(-inf - (-inf)) is NaN": _merge(guard=False),
}


@pytest.mark.parametrize("phrase", MERGE_WRONG)
def test_merge_checker_names_the_mistake(phrase):
    verdict = ex.check_merge_states(MERGE_WRONG[phrase])
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message


def test_merge_cases_cover_the_edge_cases():
    cases = ex._merge_cases() + ex._empty_cases()
    assert any(c["acc_a"].dim() == 4 for c in cases)                             # batch, heads
    assert any(c["acc_a"].shape[-2] == 1 for c in cases)                         # one query
    assert any(c["m_a"].max() > 709 for c in cases)                              # large logits
    first = cases[0]                                   # either block's max the larger: the first
    assert (first["m_a"] > first["m_b"]).any() and (first["m_a"] < first["m_b"]).any()
    assert any(torch.isinf(c["m_b"]).any() and torch.isfinite(c["m_a"]).all() for c in cases)
    both = cases[-1]
    assert (torch.isinf(both["m_a"]) & torch.isinf(both["m_b"])).any()           # no key at all


# --- exercise 3: the KV cache of a model -------------------------------------------------------


def size_of(dtype):
    return torch.empty((), dtype=dtype).element_size()


def test_kv_checker_accepts_the_reference_and_a_learner_solution():
    assert ex.check_kv_cache_bytes(ex.kv_cache_bytes_reference)

    def learner(n_tokens, num_layers, num_heads, num_kv_heads, head_dim, dtype):
        per_token = 2 * num_kv_heads * head_dim * size_of(dtype)    # K and V, one layer
        return torch.tensor(per_token * num_layers * n_tokens)      # a tensor answer is fine

    assert ex.check_kv_cache_bytes(learner)


KV_WRONG = {
    "counts the keys only": lambda n, L, h, kv, d, t: L * kv * d * size_of(t) * n,
    "you counted the query heads": lambda n, L, h, kv, d, t: 2 * L * h * d * size_of(t) * n,
    "you assumed 4 bytes per number": lambda n, L, h, kv, d, t: 2 * L * kv * d * 4 * n,
    "the number of cached numbers, not of bytes": lambda n, L, h, kv, d, t: 2 * L * kv * d * n,
    "one layer's cache": lambda n, L, h, kv, d, t: 2 * kv * d * size_of(t) * n,
    "the cache of one token": lambda n, L, h, kv, d, t: 2 * L * kv * d * size_of(t),
    "a number of bits": lambda n, L, h, kv, d, t: 16 * L * kv * d * size_of(t) * n,
}


@pytest.mark.parametrize("phrase", KV_WRONG)
def test_kv_checker_names_the_mistake(phrase):
    verdict = ex.check_kv_cache_bytes(KV_WRONG[phrase])
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message


def test_kv_checker_says_what_a_non_number_is():
    verdict = ex.check_kv_cache_bytes(lambda *args: "1 GiB")
    assert not verdict and "expected a number of bytes, got str" in verdict.message
