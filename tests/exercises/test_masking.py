"""Notebook 05's checkers (``exercises.masking``): each accepts the reference and rejects known
wrong answers with a hint that names the mistake."""

from __future__ import annotations

import math

import pytest
import torch

from attn_helpers import exercises
from attn_helpers.exercises.masking import (
    _decode,
    _full_causal,
    _kv_cases,
    check_kv_cache_step,
    check_window_mask,
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

    assert not check_kv_cache_step(concatenates)


# --- window_mask -----------------------------------------------------------------------------


def _offsets(n):
    return torch.arange(n)[:, None] - torch.arange(n)[None, :]        # i - j


def window_mask(n, window):
    return (_offsets(n) >= 0) & (_offsets(n) < window)


def test_window_mask_accepts_the_reference():
    assert check_window_mask(window_mask)


@pytest.mark.parametrize("wrong, words", [
    (lambda n, w: _offsets(n).abs() < w, "looks both ways"),
    (lambda n, w: (_offsets(n) >= 0) & (_offsets(n) <= w), "off by one"),
    (lambda n, w: window_mask(n, w).T, "transposed"),
    (lambda n, w: torch.ones(n, n, dtype=torch.bool).tril(), "plain causal mask"),
    (lambda n, w: ~window_mask(n, w), "inverted"),
    (lambda n, w: (_offsets(n) > 0) & (_offsets(n) <= w), "always sees itself"),
])
def test_window_mask_rejects_known_mistakes_with_their_hint(wrong, words):
    verdict = check_window_mask(wrong)
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


def test_window_mask_stub_and_dtype():
    assert check_window_mask(_stub).message == "window_mask is not implemented yet."
    verdict = check_window_mask(lambda n, w: window_mask(n, w).int())
    assert not verdict and "bool" in verdict.message


def test_exercises_are_registered_with_three_hints():
    for key in ("masking.kv_cache_step", "masking.window_mask"):
        assert key in exercises.EXERCISES and len(exercises.EXERCISES[key].hints) == 3
