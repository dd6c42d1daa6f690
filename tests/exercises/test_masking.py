"""Notebook 05's checkers: each accepts the reference and names known wrong answers."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _exercises import assert_rejected, assert_skeleton

import attn_helpers as ah
from attn_helpers.exercises.masking import (
    _PACK_MISTAKES,
    _PREFIX_MISTAKES,
    _WRONG,
    _pack,
    _prefix_lm,
    _ring_cases,
    _ring_step,
    _run_steps,
    check_pack_documents,
    check_prefix_lm_mask,
    check_rolling_cache_step,
)

# --- pack_documents (documents packed into one row: the mask and the positions) ---------------


def pack_documents(lengths):                                          # the reference, as a learner
    i = torch.arange(int(lengths.sum()))
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths)    # (n,)
    starts = torch.cumsum(lengths, 0) - lengths
    return (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None]), i - starts[doc]


@pytest.mark.parametrize("flaw, hint", _PACK_MISTAKES, ids=[flaw for flaw, _ in _PACK_MISTAKES])
def test_pack_documents_names_each_known_mistake_with_its_hint(flaw, hint):
    def wrong(lengths):                                               # as a learner returns it
        mask, positions = _pack(lengths, flaw)
        return mask.bool(), positions.long()

    assert_rejected(check_pack_documents(wrong), "\nHint: " + hint)


def test_pack_documents_names_dtypes_a_list_and_a_missing_output():
    assert_rejected(check_pack_documents(lambda L: (pack_documents(L)[0].int(), pack_documents(L)[1])),
                    "must be a bool tensor")
    assert_rejected(check_pack_documents(lambda L: (pack_documents(L)[0], pack_documents(L)[1].float())),
                    "must be an integer tensor")
    additive = lambda L: (torch.where(pack_documents(L)[0], 0.0, -math.inf), pack_documents(L)[1])  # noqa: E731
    assert_rejected(check_pack_documents(additive), "yours is additive", "mask == 0")
    assert_rejected(check_pack_documents(lambda L: pack_documents(L)[0]), "expected 2")
    assert_rejected(check_pack_documents(lambda L: pack_documents(L)[::-1]), "first output, the mask")
    verdict = check_pack_documents(lambda L: (pack_documents(L)[0], pack_documents(L)[1].tolist()))
    assert_rejected(verdict, "the positions must be a tensor, got list")      # not the bool mask


def test_pack_documents_accepts_the_reference_and_the_level_3_skeleton_filled_in():
    assert check_pack_documents(pack_documents)
    assert_skeleton("masking.pack_documents", "lengths", check_pack_documents, (
        "torch.repeat_interleave(torch.arange(len(lengths)), lengths)",
        "(doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])", "i - starts[doc]"))


def test_packing_equals_each_document_alone_through_torch_attention():
    """With the mask and learned positions, a packed row gives each document's outputs alone."""
    lengths = torch.tensor([3, 1, 4])
    mask, positions = pack_documents(lengths)
    g = torch.Generator().manual_seed(0)
    x, table = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    packed = F.scaled_dot_product_attention(*(x + table[positions],) * 3, attn_mask=mask)
    alone = torch.cat([F.scaled_dot_product_attention(*(part + table[:len(part)],) * 3, is_causal=True)
                       for part in x.split(lengths.tolist())])
    assert torch.allclose(packed, alone, atol=1e-6)


# --- rolling_cache_step (a rolling-buffer KV cache for a sliding window) ----------------------


def rolling_cache_step(k_cache, v_cache, t, q_t, k_t, v_t):
    w = k_cache.shape[-2]
    k_cache[:, :, t % w] = k_t[:, :, 0]                               # overwrite token t - W
    v_cache[:, :, t % w] = v_t[:, :, 0]
    filled = min(t + 1, w)
    scores = q_t @ k_cache[:, :, :filled].transpose(-2, -1) / math.sqrt(q_t.shape[-1])
    return torch.softmax(scores, dim=-1) @ v_cache[:, :, :filled]     # (b, h, 1, d_v)


def in_time_order(k_cache, v_cache, t, q_t, k_t, v_t):                 # torch.roll, then attend
    w = k_cache.shape[-2]
    k_cache[..., t % w, :], v_cache[..., t % w, :] = k_t[..., 0, :], v_t[..., 0, :]
    if t < w:
        keys, values = k_cache[..., :t + 1, :], v_cache[..., :t + 1, :]
    else:                                                             # oldest first, newest last
        keys, values = (torch.roll(c, -(t % w + 1), dims=-2) for c in (k_cache, v_cache))
    return ah.scaled_dot_product_attention(q_t, keys, values)[0]


def with_a_mask(k_cache, v_cache, t, q_t, k_t, v_t):                   # all W slots, masked
    w = k_cache.shape[-2]
    k_cache[..., t % w, :], v_cache[..., t % w, :] = k_t[..., 0, :], v_t[..., 0, :]
    filled = torch.arange(w) <= t                                     # (W,) bool
    return ah.scaled_dot_product_attention(q_t, k_cache, v_cache, filled)[0]


def from_the_end(k_cache, v_cache, t, q_t, k_t, v_t):                 # slot (-t - 1) mod w, masked
    w = k_cache.shape[-2]
    k_cache[:, :, (-t - 1) % w], v_cache[:, :, (-t - 1) % w] = k_t[:, :, 0], v_t[:, :, 0]
    filled = torch.zeros(w, dtype=torch.bool)
    filled[[(-u - 1) % w for u in range(max(0, t - w + 1), t + 1)]] = True
    return ah.scaled_dot_product_attention(q_t, k_cache, v_cache, filled[None, :])[0]


@pytest.mark.parametrize("answer", [rolling_cache_step, in_time_order, with_a_mask, from_the_end])
def test_rolling_cache_step_accepts_right_answers_in_any_order_of_the_slots(answer):
    assert check_rolling_cache_step(answer)


def test_the_steps_of_the_reference_are_windowed_attention():
    for case in _ring_cases():
        q, k, v, w = case["q"], case["k"], case["v"], case["k_cache"].shape[-2]
        windowed = ah.local_attention(q, k, v, w)                     # query blocks of w
        assert torch.allclose(_run_steps(rolling_cache_step)(*case.values()), windowed, atol=1e-5)
        causal = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
        torch_windowed = F.scaled_dot_product_attention(q, k, v, attn_mask=causal & ~causal.tril(-w))
        assert torch.allclose(torch_windowed, windowed, atol=1e-5)    # keys i - w < j <= i


@pytest.mark.parametrize("hint, flaw", _WRONG, ids=range(len(_WRONG)))
def test_rolling_cache_step_names_each_known_mistake_with_its_hint(hint, flaw):
    assert_rejected(check_rolling_cache_step(_ring_step(**flaw)), "\nHint: " + hint)


def on_a_copy(k_cache, v_cache, *args):                               # the caller's caches unchanged
    return rolling_cache_step(k_cache.clone(), v_cache.clone(), *args)


def shifted(k_cache, v_cache, t, q_t, k_t, v_t):                       # in time order, in place
    w = k_cache.shape[-2]
    if t >= w:
        for cache in (k_cache, v_cache):
            cache[..., :-1, :] = cache[..., 1:, :].clone()
    return rolling_cache_step(k_cache, v_cache, min(t, w - 1), q_t, k_t, v_t)


@pytest.mark.parametrize("wrong, words", [
    (on_a_copy, ["at step t=0 (w=3 slots) neither cache changed", "written on a copy"]),
    (shifted, ["at step t=3 (w=3 slots) 3 slots of a cache changed", "one slot per step"]),
])
def test_caches_not_written_in_place_or_shifted_whole_are_refused(wrong, words):
    assert_rejected(check_rolling_cache_step(wrong), *words)


def test_writing_slot_t_past_the_end_is_named():
    def slot_t(k_cache, v_cache, t, q_t, k_t, v_t):                   # IndexError at t = W
        k_cache[:, :, t], v_cache[:, :, t] = k_t[:, :, 0], v_t[:, :, 0]
        return rolling_cache_step(k_cache, v_cache, t, q_t, k_t, v_t)

    verdict = check_rolling_cache_step(slot_t)
    assert_rejected(verdict, "at step t=3 (w=3 slots)", "out of bounds", "\nHint: ",
                    "token t cannot go to slot t once t >= w")


def test_rolling_cache_step_names_a_whole_ring_returned():          # (b, h, w, d_v): wrong shape
    whole_ring = lambda *args: [rolling_cache_step(*args), args[1]][1]   # noqa: E731 - the v_cache
    verdict = check_rolling_cache_step(whole_ring)
    assert_rejected(verdict, "at step t=0 (w=3 slots) rolling_cache_step returned (1, 1, 3, 4)",
                    "token t's output only: (b, h, 1, d_v) = (1, 1, 1, 4)")
    assert "raised" not in verdict.message              # the checker refused it; the step raised nothing


def test_rolling_cache_step_accepts_the_level_3_skeleton_filled_in():
    assert_skeleton("masking.rolling_cache_step", "k_cache, v_cache, t, q_t, k_t, v_t",
                    check_rolling_cache_step, ("t % w", "min(t + 1, w)"), ah=ah)


def prefix_lm_mask(attention_mask, prefix_len):                  # the reference, as a learner
    n = attention_mask.shape[-1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    in_prefix = j < prefix_len[:, None, None, None]                   # (b, 1, 1, n)
    return ((j <= i) | in_prefix) & attention_mask.bool()[:, None, None, :]


def test_prefix_lm_mask_accepts_the_reference_blank_pad_rows_and_the_skeleton():
    assert check_prefix_lm_mask(prefix_lm_mask)
    assert check_prefix_lm_mask(lambda m, p: prefix_lm_mask(m, p) & m.bool()[:, None, :, None])
    assert_skeleton("masking.prefix_lm_mask", "attention_mask, prefix_len", check_prefix_lm_mask,
                    ("j < prefix_len[:, None, None, None]", "attention_mask.bool()[:, None, None, :]"))


@pytest.mark.parametrize("flaw, hint", _PREFIX_MISTAKES, ids=[flaw for flaw, _ in _PREFIX_MISTAKES])
def test_prefix_lm_mask_names_each_known_mistake_with_its_hint(flaw, hint):
    assert_rejected(check_prefix_lm_mask(lambda m, p: _prefix_lm(m, p, flaw).bool()), "\nHint: " + hint)


@pytest.mark.parametrize("wrong, words", [
    (lambda m, p: prefix_lm_mask(m, p).float(), ["bool", "0 and 1 hide nothing"]),
    (lambda m, p: prefix_lm_mask(m, p)[:, 0], ["(b, h, n, n)"]),
    (lambda m, p: prefix_lm_mask(m, p).tolist(), ["the mask must be a tensor, got list"]),
    (lambda m, p: m.bool()[:, None, None, :], ["got (1, 1, 1, 6)", "padding mask alone"]),
    (lambda m, p: (torch.arange(6) < p) | torch.ones(6, 6).tril().bool() if len(m) > 1  # p: (b,)
     else prefix_lm_mask(m, p), ["did not broadcast", "they lack"]),
])
def test_prefix_lm_mask_names_a_float_or_list_a_missing_axis_and_a_prefix_not_broadcast(wrong, words):
    assert_rejected(check_prefix_lm_mask(wrong), *words)


def test_a_filled_count_that_leaves_the_newest_key_out_is_named_with_the_course_attention():
    """``filled = min(t, w)``: with notebook 02's attention it fails at t = 0 (no key at all), and
    the hint names both ways to get there; with a hand-written softmax it gets its own hint."""
    def newest_left_out(k_cache, v_cache, t, q_t, k_t, v_t):
        w = k_cache.shape[-2]
        k_cache[:, :, t % w], v_cache[:, :, t % w] = k_t[:, :, 0], v_t[:, :, 0]
        filled = min(t, w)
        return ah.scaled_dot_product_attention(q_t, k_cache[:, :, :filled], v_cache[:, :, :filled])[0]

    verdict = check_rolling_cache_step(newest_left_out)
    assert_rejected(verdict, "at step t=0", "\nHint: ", "token t missed itself",
                    "left the newest key out")
    for key_line in ("min(t + 1, w)", "t + 1", "t % w"):
        assert key_line not in verdict.message, key_line


def test_a_softmax_over_unwritten_slots_is_named():
    """All w slots, garbage included, softmaxed then zeroed and renormalised: a 0 / 0 NaN hint."""
    def over_garbage(k_cache, v_cache, t, q_t, k_t, v_t):
        w = k_cache.shape[-2]
        k_cache[:, :, t % w], v_cache[:, :, t % w] = k_t[:, :, 0], v_t[:, :, 0]
        weights = torch.softmax(q_t @ k_cache.transpose(-2, -1) / math.sqrt(q_t.shape[-1]), -1)
        weights = weights * (torch.arange(w) <= t)
        return weights / weights.sum(-1, keepdim=True) @ v_cache

    assert_rejected(check_rolling_cache_step(over_garbage), "with nan", "\nHint: ",
                    "unwritten slots must not enter the softmax")


def test_hugging_faces_attention_mask_becomes_the_bias_notebook_05s_table_names():
    """transformers turns its attention_mask (1 = keep) and the causal rule into an additive bias: 0
    where a key takes part, the dtype's minimum elsewhere; it gives torch's bool-mask attention."""
    masking_utils = pytest.importorskip("transformers.masking_utils")
    keep = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])                     # (b, n): 3 pads
    allowed = ah.causal_mask(8) & keep.bool()                           # causal AND a real key
    bias = masking_utils.eager_mask(1, 8, 8, attention_mask=keep.bool(), dtype=torch.float32)[0, 0]
    assert torch.equal(bias, torch.where(allowed, 0.0, torch.finfo(torch.float32).min))
    q = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    with_bias = torch.softmax(q @ q.T / 2 + bias, -1) @ q
    assert torch.allclose(with_bias, F.scaled_dot_product_attention(q, q, q, attn_mask=allowed),
                          atol=1e-6)
