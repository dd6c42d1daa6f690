"""Notebook 05's checkers (``exercises.masking``): each accepts the reference and rejects known
wrong answers with a hint that names the mistake."""

from __future__ import annotations

import math

import pytest
import torch
from _exercises import assert_rejected, skeleton

from attn_helpers import exercises
from attn_helpers.exercises.masking import (
    _decode,
    _full_causal,
    _kv_cases,
    check_kv_cache_step,
    check_window_mask,
    left_padded_window_mask,
)
from attn_helpers.kv_cache import decode_with_cache


def _stub(*args):
    raise NotImplementedError


# --- kv_cache_step ---------------------------------------------------------------------------


def kv_cache_step(k_cache, v_cache, t, q_t, k_t, v_t, *, slot=0, first=lambda t: 0,
                  last=lambda t, n_max: t + 1, scale=None, dim=-1, store_value=True):
    k_cache[..., t + slot, :] = k_t[..., 0, :]
    if store_value:
        v_cache[..., t + slot, :] = v_t[..., 0, :]
    keys = k_cache[..., first(t):last(t, k_cache.shape[-2]), :]      # (b, h, t + 1, d_k)
    values = v_cache[..., first(t):last(t, k_cache.shape[-2]), :]    # (b, h, t + 1, d_v)
    scale = 1 / math.sqrt(q_t.shape[-1]) if scale is None else scale
    return torch.softmax(q_t @ keys.transpose(-2, -1) * scale, dim=dim) @ values


def test_kv_cache_step_accepts_the_reference():
    assert check_kv_cache_step(kv_cache_step)


def test_the_reference_is_full_causal_attention_and_the_course_cache_agrees():
    for case in _kv_cases():
        out, k_filled, v_filled = _decode(kv_cache_step)(*case.values())
        expected, k, v = _full_causal(*case.values())
        assert torch.allclose(out, expected, atol=1e-5)
        assert torch.equal(k_filled, k) and torch.equal(v_filled, v)
        cached, _ = decode_with_cache(case["q"], case["k"], case["v"])
        assert torch.allclose(cached, expected, atol=1e-5)


def test_cases_have_garbage_past_the_sequence_and_leave_the_inputs_alone():
    case = _kv_cases()[0]
    before = case["k_cache"].clone()
    _decode(kv_cache_step)(*case.values())
    assert torch.equal(case["k_cache"], before)                       # the checker works on copies
    assert case["k_cache"].abs().max() > 3                             # not zeros: garbage


@pytest.mark.parametrize("mistake, words", [
    ({"last": lambda t, n_max: n_max}, "garbage slots included"),
    ({"last": lambda t, n_max: t}, "leave out the new token itself"),
    ({"slot": 1}, "not t + 1"),
    ({"first": lambda t: t}, "the new token only"),
    ({"store_value": False}, "write v_t into v_cache"),
    ({"scale": 1.0}, "not scaled"),
    ({"dim": -2}, "wrong axis"),
])
def test_kv_cache_step_rejects_known_mistakes_with_their_hint(mistake, words):
    verdict = check_kv_cache_step(lambda *args: kv_cache_step(*args, **mistake))
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


def test_kv_cache_step_reports_stubs_shapes_and_concatenation():
    assert check_kv_cache_step(_stub).message == "kv_cache_step is not implemented yet."
    assert "not implemented yet" in check_kv_cache_step(lambda *args: None).message
    assert not check_kv_cache_step("kv_cache_step")

    def whole_row(k_cache, v_cache, t, q_t, k_t, v_t):               # (b, h, t+1, d_v): wrong shape
        kv_cache_step(k_cache, v_cache, t, q_t, k_t, v_t)
        return v_cache[..., :t + 1, :]

    verdict = check_kv_cache_step(whole_row)
    assert not verdict and "(b, h, 1, d_v)" in verdict.message

    def concatenates(k_cache, v_cache, t, q_t, k_t, v_t):            # the cache is never written
        keys = torch.cat([k_cache[..., :t, :], k_t], dim=-2)
        values = torch.cat([v_cache[..., :t, :], v_t], dim=-2)
        return torch.softmax(q_t @ keys.transpose(-2, -1) / math.sqrt(q_t.shape[-1]), -1) @ values

    assert_rejected(check_kv_cache_step(concatenates), "\nHint: ", "slot t was never written")


def test_kv_cache_step_accepts_the_course_attention_and_the_filled_skeleton():
    import attn_helpers as ah

    signature = "k_cache, v_cache, t, q_t, k_t, v_t"
    assert check_kv_cache_step(skeleton("masking.kv_cache_step", signature, (
        "k_t[:, :, 0]", "v_t[:, :, 0]", "k_cache[:, :, :t + 1]", "v_cache[:, :, :t + 1]"), ah=ah))


def test_kv_cache_step_blocks_torchs_fused_attention():
    import torch.nn.functional as F

    def fused(k_cache, v_cache, t, q_t, k_t, v_t):
        k_cache[..., t, :], v_cache[..., t, :] = k_t[..., 0, :], v_t[..., 0, :]
        return F.scaled_dot_product_attention(q_t, k_cache[..., :t + 1, :], v_cache[..., :t + 1, :])

    assert_rejected(check_kv_cache_step(fused), "scaled_dot_product_attention",
                    "which does this exercise for you")

    def through_aten(k_cache, v_cache, t, q_t, k_t, v_t):
        k_cache[..., t, :], v_cache[..., t, :] = k_t[..., 0, :], v_t[..., 0, :]
        return torch.ops.aten.scaled_dot_product_attention(q_t, k_cache[..., :t + 1, :],
                                                           v_cache[..., :t + 1, :])

    assert_rejected(check_kv_cache_step(through_aten), "torch's fused attention",
                    "torch.ops.aten.scaled_dot_product_attention")


def test_kv_cache_step_blocks_the_course_cache():
    import attn_helpers as ah

    def lazy(k_cache, v_cache, t, q_t, k_t, v_t):
        k_cache[..., t, :], v_cache[..., t, :] = k_t[..., 0, :], v_t[..., 0, :]
        cache = ah.KVCache(max_len=k_cache.shape[-2])
        cache.append(k_cache[..., :t + 1, :], v_cache[..., :t + 1, :])
        return cache.attend(q_t)[0]

    assert_rejected(check_kv_cache_step(lazy), "KVCache.append", "which does this exercise for you")


# --- window_mask (a sliding-window mask for a left-padded batch) --------------------------------


def window_mask(lengths, n, window):
    j = torch.arange(n)
    real = j[None, :] >= n - lengths[:, None]                        # (b, n): the last lengths[b]
    offset = j[:, None] - j[None, :]                                  # i - j
    return real[:, None, :] & (offset >= 0) & (offset < window)


def test_window_mask_accepts_the_reference_and_the_level_3_skeleton_filled_in():
    assert check_window_mask(window_mask)
    assert check_window_mask(skeleton("masking.window_mask", "lengths, n, window", (
        "j[None, :] >= n - lengths[:, None]", "real[:, None, :] & (offset >= 0) & (offset < window)")))


def test_the_answer_is_left_padded_with_empty_pad_rows():
    mask = left_padded_window_mask(torch.tensor([3, 5]), 5, 2)
    assert mask.shape == (2, 5, 5)
    assert not mask[0, :2].any() and not mask[0, :, :2].any()        # two pads at the start
    assert mask[0, 2:].sum(-1).tolist() == [1, 2, 2] and mask[1].sum(-1).tolist() == [1, 2, 2, 2, 2]


def _j(n):
    return torch.arange(n)


def _offsets(n):
    return _j(n)[:, None] - _j(n)[None, :]                            # i - j


@pytest.mark.parametrize("wrong, words", [
    (lambda L, n, w: (_j(n)[None, :] < L[:, None])[:, None, :] & window_mask(L * 0 + n, n, w),
     "LEFT-padded"),
    (lambda L, n, w: (_j(n)[None, :] >= n - L[:, None])[:, None, :] & (_offsets(n).abs() < w),
     "looks both ways"),
    (lambda L, n, w: window_mask(L, n, w + 1), "off by one"),
    (lambda L, n, w: window_mask(L, n, w).transpose(1, 2), "transposed"),
    (lambda L, n, w: (_j(n)[None, :] >= n - L[:, None])[:, :, None] & window_mask(L * 0 + n, n, w),
     "queries (rows) instead of the keys"),
    (lambda L, n, w: window_mask(L, n, n + 1), "no window"),
    (lambda L, n, w: window_mask(L[:1].expand(len(L)), n, w), "first sentence's length"),
    (lambda L, n, w: window_mask(L, n, w) | (torch.eye(n, dtype=torch.bool)
                                             & ~(_j(n)[None, :, None] >= n - L[:, None, None])),
     "see themselves"),
    (lambda L, n, w: ~window_mask(L, n, w), "inverted"),
])
def test_window_mask_rejects_known_mistakes_with_their_hint(wrong, words):
    assert_rejected(check_window_mask(wrong), "\nHint: ", words)


@pytest.mark.parametrize("helper", ["sliding_window_mask", "causal_mask", "padding_mask"])
def test_window_mask_blocks_the_library_mask_builders(helper):
    import attn_helpers as ah
    from attn_helpers import masks

    def lazy(lengths, n, window):           # right, but built from the course's masks
        real = ~ah.padding_mask(n - lengths, n)
        return real[:, None, :] & ah.sliding_window_mask(n, window) & ah.causal_mask(n)

    def lazy_module(lengths, n, window):
        return getattr(masks, helper)(n, window) if helper != "padding_mask" else masks.padding_mask(
            lengths, n)

    for fn in (lazy, lazy_module):
        verdict = check_window_mask(fn)
        assert_rejected(verdict, "which does this exercise for you")
    assert ah.sliding_window_mask(3, 2).shape == (3, 3)              # restored afterwards


def test_window_mask_refuses_a_wrapper_around_the_checkers_own_answer():
    from attn_helpers.exercises import masking

    def wrapper(lengths, n, window):
        return masking.left_padded_window_mask(lengths, n, window)

    assert_rejected(check_window_mask(wrapper), "left_padded_window_mask")
    assert_rejected(check_window_mask(lambda L, n, w: left_padded_window_mask(L, n, w)),
                    "left_padded_window_mask")


def test_window_mask_stub_and_dtype():
    assert check_window_mask(_stub).message == "window_mask is not implemented yet."
    verdict = check_window_mask(lambda L, n, w: window_mask(L, n, w).int())
    assert not verdict and "bool" in verdict.message


def test_exercises_are_registered_with_three_hints():
    for key in ("masking.kv_cache_step", "masking.window_mask"):
        assert key in exercises.EXERCISES and len(exercises.EXERCISES[key].hints) == 3
