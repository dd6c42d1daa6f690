"""Notebook 05's checkers (``exercises.masking``): each accepts the reference and rejects known
wrong answers with a hint that names the mistake."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _exercises import assert_rejected, assert_skeleton, skeleton

import attn_helpers as ah
from attn_helpers.exercises.masking import (
    _ring_cases,
    _run_steps,
    _sliding_window,
    check_pack_documents,
    check_rolling_cache_step,
    check_window_mask,
)

# --- pack_documents (documents packed into one row: the mask and the positions) ---------------


def pack_documents(lengths):                                          # the reference, as a learner
    i = torch.arange(int(lengths.sum()))
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths)    # (n,)
    starts = torch.cumsum(lengths, 0) - lengths
    return (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None]), i - starts[doc]


def _doc(lengths, right=True):                                        # searchsorted on the ends
    return torch.searchsorted(torch.cumsum(lengths, 0), torch.arange(int(lengths.sum())), right=right)


def _causal(lengths):
    return ah.causal_mask(int(lengths.sum()))


@pytest.mark.parametrize("wrong, words", [
    (lambda L: (_causal(L), pack_documents(L)[1]), "documents see each other"),
    (lambda L: (_doc(L)[:, None] == _doc(L)[None, :], pack_documents(L)[1]), "causal rule"),
    (lambda L: ((_doc(L, False)[:, None] == _doc(L, False)) & _causal(L),     # one doc, both
                torch.arange(int(L.sum())) - (torch.cumsum(L, 0) - L)[_doc(L, False)]),
     "first token was put in the previous document"),
    (lambda L: (pack_documents(L)[0].T, pack_documents(L)[1]), "transposed"),
    (lambda L: (~pack_documents(L)[0], pack_documents(L)[1]), "inverted"),
    (lambda L: (pack_documents(L)[0], torch.arange(int(L.sum()))), "run on across the row"),
    (lambda L: (pack_documents(L)[0], pack_documents(L)[1] + 1), "start at 1"),
    (lambda L: (pack_documents(L)[0], torch.arange(int(L.sum())) - torch.cumsum(L, 0)[_doc(L)]),
     "where each document ends"),
    (lambda L: (pack_documents(L)[0], torch.cumsum(L, 0)[_doc(L)] - 1 - torch.arange(int(L.sum()))),
     "count down to each document's end"),                            # review s9b: n - 1 .. 0
    (lambda L: (pack_documents(L)[0], torch.cumsum(L, 0)[_doc(L)] - torch.arange(int(L.sum()))),
     "count down from each document's end"),                          # n .. 1
    (lambda L: ((_doc(L)[:, None] == _doc(L)[None, :]) | _causal(L), pack_documents(L)[1]),
     "joined with OR"),                                               # | instead of &
    (lambda L: ((_doc(L)[:, None] == _doc(L)[None, :]) & _causal(L).tril(-1), pack_documents(L)[1]),
     "you wrote j < i"),                                              # review s10: strict causal rule
    (lambda L: (pack_documents(L)[0], torch.arange(int(L.sum())) % L[0]),
     "modulo the first document's length"),                          # review s10
    (lambda L: (pack_documents(L)[0], _doc(L)), "document number"),   # review s10 (05b)
    (lambda L: (pack_documents(L)[0],                                 # review s10 (05b)
                torch.arange(int(L.sum())) - (torch.cumsum(L, 0) - L)[_doc(L).clamp(max=1)]),
     "only the second document restarts"),
])
def test_pack_documents_rejects_known_mistakes_with_their_hint(wrong, words):
    assert_rejected(check_pack_documents(wrong), "\nHint: ", words)


def test_pack_documents_names_dtypes_and_a_missing_output():
    assert_rejected(check_pack_documents(lambda L: (pack_documents(L)[0].int(), pack_documents(L)[1])),
                    "must be a bool tensor")
    assert_rejected(check_pack_documents(lambda L: (pack_documents(L)[0], pack_documents(L)[1].float())),
                    "must be an integer tensor")
    assert_rejected(check_pack_documents(lambda L: pack_documents(L)[0]), "expected 2")
    assert_rejected(check_pack_documents(lambda L: pack_documents(L)[::-1]),   # review s10
                    "wrong order")
    assert "at (i, j) = (0, 1) you gave True, expected False.\n" in check_pack_documents(
        lambda L: (~pack_documents(L)[0], pack_documents(L)[1])).message       # the axes named


def test_pack_documents_accepts_the_reference_and_the_level_3_skeleton_filled_in():
    assert check_pack_documents(pack_documents)
    assert_skeleton("masking.pack_documents", "lengths", check_pack_documents, (
        "torch.repeat_interleave(torch.arange(len(lengths)), lengths)",
        "(doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])", "i - starts[doc]"))


def test_packing_equals_each_document_alone_through_torch_attention():
    """The point of the exercise: with the mask and learned positions, a packed row gives each
    document's outputs as if it ran alone (torch's is_causal=True on each document)."""
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
        keys = torch.roll(k_cache, -(t % w + 1), dims=-2)
        values = torch.roll(v_cache, -(t % w + 1), dims=-2)
    return ah.scaled_dot_product_attention(q_t, keys, values)[0]


def with_a_mask(k_cache, v_cache, t, q_t, k_t, v_t):                   # all W slots, masked
    w = k_cache.shape[-2]
    k_cache[..., t % w, :], v_cache[..., t % w, :] = k_t[..., 0, :], v_t[..., 0, :]
    filled = torch.arange(w) <= t                                     # (W,) bool
    return ah.scaled_dot_product_attention(q_t, k_cache, v_cache, filled)[0]


@pytest.mark.parametrize("answer", [rolling_cache_step, in_time_order, with_a_mask])
def test_rolling_cache_step_accepts_right_answers_in_any_order_of_the_slots(answer):
    assert check_rolling_cache_step(answer)


def test_the_reference_is_windowed_attention():
    for case in _ring_cases():
        q, k, v, w = case["q"], case["k"], case["v"], case["k_cache"].shape[-2]
        out, k_ring, v_ring = _sliding_window(*case.values())
        assert torch.allclose(out, ah.local_attention(q, k, v, w), atol=1e-5)   # query blocks of w
        got, k_filled, v_filled = _run_steps(rolling_cache_step)(*case.values())
        assert torch.allclose(got, out, atol=1e-5)
        assert torch.equal(k_filled, k_ring) and torch.equal(v_filled, v_ring)


def _step(k_cache, v_cache, t, q_t, k_t, v_t, *, slot=lambda t, w: t % w, seen=None,
          attend_first=False, old_and_new=False, write_v=True, v_from_k=False, copy=False,
          shift=False, scale=None, is_causal=False):
    """A learner's step with one mistake (all off: right), written as a learner would."""
    w = k_cache.shape[-2]
    old_k, old_v = k_cache[..., :min(t, w), :].clone(), v_cache[..., :min(t, w), :].clone()
    if copy:
        k_cache, v_cache = k_cache.clone(), v_cache.clone()
    at = slot(t, w)
    if shift:                                                         # keep the cache in time order
        if t >= w:
            k_cache[..., :-1, :] = k_cache[..., 1:, :].clone()
            v_cache[..., :-1, :] = v_cache[..., 1:, :].clone()
        at = min(t, w - 1)
    k_cache[..., at:at + 1, :] = k_t                                  # a slice: empty past the end
    if write_v:
        v_cache[..., at:at + 1, :] = k_t if v_from_k else v_t
    if attend_first:
        keys, values = old_k, old_v
    elif old_and_new:
        keys, values = torch.cat([old_k, k_t], -2), torch.cat([old_v, v_t], -2)
    else:
        slots = seen(t, w) if seen is not None else slice(0, min(t + 1, w))
        keys, values = k_cache[..., slots, :], v_cache[..., slots, :]
    if is_causal:                                                     # torch's fused kernel, top-left
        return torch.nn.functional.scaled_dot_product_attention(q_t, keys, values, is_causal=True)
    c = 1 / math.sqrt(q_t.shape[-1]) if scale is None else scale
    return torch.softmax(q_t @ keys.transpose(-2, -1) * c, dim=-1) @ values


@pytest.mark.parametrize("mistake, words", [
    ({"seen": lambda t, w: slice(0, min(t, w))}, "did not see the key just written"),
    ({"seen": lambda t, w: slice(0, w)}, "all w slots before the ring was full"),
    ({"slot": lambda t, w: t}, "the ring never changed once full"),
    ({"attend_first": True}, "token t missed itself"),
    ({"old_and_new": True}, "w + 1 keys"),
    ({"seen": lambda t, w: [s for s in range(min(t + 1, w)) if t < w - 1 or s != (t + 1) % w]},
     "w - 1 keys"),
    ({"seen": lambda t, w: slice(0, t % w + 1)}, "only the slots up to the newest one"),
    ({"slot": lambda t, w: (t + 1) % w}, "one slot too far"),
    ({"slot": lambda t, w: (t - 1) % w}, "one slot back"),
    ({"slot": lambda t, w: min(t, w - 1)}, "overwrote the newest key"),
    ({"slot": lambda t, w: t % (w - 1)}, "only w - 1 of its w slots"),  # review s10
    ({"write_v": False}, "not the value"),
    ({"v_from_k": True}, "the value cache got the key"),
    ({"copy": True}, "written on a copy"),          # refused at step 0, as review 4's torch.cat shift
    ({"copy": True, "shift": True}, "neither cache changed"),
    ({"scale": 1.0}, "not scaled"),
    ({"is_causal": True}, "anchors its causal mask top-left"),
])
def test_rolling_cache_step_rejects_known_mistakes_with_their_hint(mistake, words):
    assert_rejected(check_rolling_cache_step(lambda *args: _step(*args, **mistake)), "\nHint: ", words)


def test_any_slot_rule_that_keeps_the_window_passes_and_shifting_is_refused():
    """Review 5: a ring filled from the end (slot (-t - 1) mod w, the filled slots masked) is a
    rolling buffer too; the checker reads the final cache in time order wherever each key went.
    Shifting the whole cache every step is refused: one slot per step."""
    def from_the_end(k_cache, v_cache, t, q_t, k_t, v_t):
        w = k_cache.shape[-2]
        k_cache[:, :, (-t - 1) % w], v_cache[:, :, (-t - 1) % w] = k_t[:, :, 0], v_t[:, :, 0]
        filled = torch.zeros(w, dtype=torch.bool)
        filled[[(-u - 1) % w for u in range(max(0, t - w + 1), t + 1)]] = True
        return ah.scaled_dot_product_attention(q_t, k_cache, v_cache, filled[None, :])[0]

    assert check_rolling_cache_step(from_the_end)
    assert_rejected(check_rolling_cache_step(lambda *args: _step(*args, shift=True)),
                    "at step t=3 (w=3 slots) 3 slots of a cache changed", "one slot per step")


def test_writing_slot_t_past_the_end_and_attending_before_writing_are_named():
    def slot_t(k_cache, v_cache, t, q_t, k_t, v_t):                   # IndexError at t = W
        k_cache[:, :, t], v_cache[:, :, t] = k_t[:, :, 0], v_t[:, :, 0]
        return rolling_cache_step(k_cache, v_cache, t, q_t, k_t, v_t)

    verdict = check_rolling_cache_step(slot_t)
    assert_rejected(verdict, "at step t=3 (w=3 slots)", "out of bounds", "\nHint: ",
                    "token t cannot go to slot t once t >= w")

    def attends_first(k_cache, v_cache, t, q_t, k_t, v_t):            # ValueError at t = 0
        w = k_cache.shape[-2]
        out, _ = ah.scaled_dot_product_attention(q_t, k_cache[:, :, :min(t, w)],
                                                 v_cache[:, :, :min(t, w)])
        k_cache[:, :, t % w], v_cache[:, :, t % w] = k_t[:, :, 0], v_t[:, :, 0]
        return out

    assert_rejected(check_rolling_cache_step(attends_first), "at step t=0", "\nHint: ",
                    "token t missed itself")


def test_rolling_cache_step_names_a_whole_ring_returned():          # (b, h, w, d_v): wrong shape
    whole_ring = lambda *args: [rolling_cache_step(*args), args[1]][1]   # noqa: E731 - the v_cache
    verdict = check_rolling_cache_step(whole_ring)
    assert_rejected(verdict, "at step t=0 (w=3 slots) rolling_cache_step returned (1, 1, 3, 4)",
                    "token t's output only: (b, h, 1, d_v) = (1, 1, 1, 4)")
    assert "raised" not in verdict.message              # the checker refused it; the step raised nothing


def test_rolling_cache_step_accepts_the_level_3_skeleton_filled_in():
    assert_skeleton("masking.rolling_cache_step", "k_cache, v_cache, t, q_t, k_t, v_t",
                    check_rolling_cache_step, ("t % w", "min(t + 1, w)"), ah=ah)


def window_mask(lengths, n, window):
    j = torch.arange(n)
    real = j[None, :] >= n - lengths[:, None]                        # (b, n): the last lengths[b]
    offset = j[:, None] - j[None, :]                                  # i - j
    return real[:, None, :] & (offset >= 0) & (offset < window)


def test_window_mask_accepts_the_reference_and_the_level_3_skeleton_filled_in():
    assert check_window_mask(window_mask)
    assert check_window_mask(skeleton("masking.window_mask", "lengths, n, window", (
        "j[None, :] >= n - lengths[:, None]", "real[:, None, :] & (offset >= 0) & (offset < window)")))


_j = torch.arange


@pytest.mark.parametrize("wrong, words", [
    (lambda L, n, w: (_j(n)[None, :] < L[:, None])[:, None, :] & window_mask(L * 0 + n, n, w),
     "LEFT-padded"),
    (lambda L, n, w: (_j(n)[None, :] >= n - L[:, None])[:, None, :]
     & ((_j(n)[:, None] - _j(n)).abs() < w), "looks both ways"),
    (lambda L, n, w: (_j(n) >= n - L[:, None, None]) & (_j(n)[:, None] - _j(n) < w), "no lower bound"),
    (lambda L, n, w: (_j(n)[None, :] >= n - L[:, None])[:, None, :]          # offset j - i
     & (_j(n) - _j(n)[:, None] >= 0) & (_j(n) - _j(n)[:, None] < w), "looks forward"),
    (lambda L, n, w: window_mask(L, n, w + 1), "w + 1 keys; it should see w"),
    (lambda L, n, w: window_mask(L, n, w).transpose(1, 2), "transposed"),
    (lambda L, n, w: (_j(n)[None, :] >= n - L[:, None])[:, :, None] & window_mask(L * 0 + n, n, w),
     "queries (rows) instead of the keys"),
    (lambda L, n, w: window_mask(L, n, n + 1), "no window"),
    (lambda L, n, w: window_mask(L[:1].expand(len(L)), n, w), "first sentence's length"),
    (lambda L, n, w: window_mask(L, n, w) | (torch.eye(n, dtype=torch.bool)
                                             & ~(_j(n)[None, :, None] >= n - L[:, None, None])),
     "see themselves"),
    (lambda L, n, w: ~window_mask(L, n, w), "inverted"),
    (lambda L, n, w: (_j(n)[None, :] > n - L[:, None])[:, None, :] & window_mask(L * 0 + n, n, w),
     "first real token was treated as padding"),
    (lambda L, n, w: (_j(n)[None, :] >= n - L[:, None] - 1)[:, None, :] & window_mask(L * 0 + n, n, w),
     "last pad was treated as a real token"),
    (lambda L, n, w: window_mask(n - L, n, w), "as if it counted the pads"),      # j >= lengths
    (lambda L, n, w: (_j(n)[None, :] >= n - L)[:, None, :] & window_mask(L * 0 + n, n, w), "last axis"),
    (lambda L, n, w: ((_j(n)[None, :] < L[:, None])[:, None, :]               # review s10 (05b)
                      & window_mask(L * 0 + n, n, w)).flip(-1), "flipped a right-padded mask"),
])
def test_window_mask_rejects_known_mistakes_with_their_hint(wrong, words):
    assert_rejected(check_window_mask(wrong), "\nHint: ", words)


def test_window_mask_wants_bool_and_reports_its_values_as_true_false():
    verdict = check_window_mask(lambda L, n, w: window_mask(L, n, w).int())
    assert not verdict and "bool" in verdict.message
    assert "at (b, i, j) = (0, 0, 1) you gave True, expected False." in check_window_mask(
        lambda *a: ~window_mask(*a)).message                                  # the axes named


def test_a_filled_count_that_leaves_the_newest_key_out_is_named_with_the_course_attention():
    """Review 6: ``filled = min(t, w)`` (the key just written not attended until the ring is full)
    got no named mistake. With notebook 02's attention it fails at t = 0 (no key at all), and the
    hint names both ways to get there; with a hand-written softmax it gets its own hint."""
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
    """Review s9: a softmax over all w slots, garbage included, then the unwritten ones zeroed and
    renormalised, gives 0 / 0 in float32; the NaN gets its own hint."""
    def over_garbage(k_cache, v_cache, t, q_t, k_t, v_t):
        w = k_cache.shape[-2]
        k_cache[:, :, t % w], v_cache[:, :, t % w] = k_t[:, :, 0], v_t[:, :, 0]
        weights = torch.softmax(q_t @ k_cache.transpose(-2, -1) / math.sqrt(q_t.shape[-1]), -1)
        weights = weights * (torch.arange(w) <= t)
        return weights / weights.sum(-1, keepdim=True) @ v_cache

    assert_rejected(check_rolling_cache_step(over_garbage), "with nan", "\nHint: ",
                    "unwritten slots must not enter the softmax")
