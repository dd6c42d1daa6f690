"""Notebook 04's checkers (``exercises.multi_head``): each accepts the reference and rejects known
wrong answers with a hint that names the mistake."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _exercises import assert_skeleton, skeleton
from torch import nn

import attn_helpers as ah
from attn_helpers import exercises
from attn_helpers.exercises.multi_head import (
    _GQA_MISTAKES,
    _MODULE_MISTAKES,
    _build,
    _gqa,
    _gqa_cases,
    _module_cases,
    _Reference,
    _torch_module,
    check_grouped_query_attention,
    check_multi_head_module,
)

# --- the multi-head attention module ---------------------------------------------------------


def make_module(*, projections=True, detach=""):
    """A learner's MultiHeadSelfAttention (fused in_proj); ``detach``: which of q, k, v it detaches."""

    class Module(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            self.num_heads = num_heads
            if projections:
                self.in_proj = nn.Linear(d_model, 3 * d_model)
            else:                                       # cell 3's four layers, not the fused one
                self.q_proj, self.k_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
                self.v_proj = nn.Linear(d_model, d_model)
            self.out_proj = nn.Linear(d_model, d_model)

        def forward(self, x, mask=None):
            b, n, d_model = x.shape
            h, d_head = self.num_heads, d_model // self.num_heads
            q, k, v = (t.reshape(b, n, h, d_head).transpose(1, 2)
                       for t in self.in_proj(x).chunk(3, dim=-1))
            q, k, v = (t.detach() if name in detach else t
                       for name, t in zip("qkv", (q, k, v), strict=True))
            if mask is not None and mask.dim() == 3:
                mask = mask[:, None]
            heads, _ = ah.scaled_dot_product_attention(q, k, v, mask)
            return self.out_proj(heads.transpose(1, 2).reshape(b, n, d_model))

    return Module


def test_module_accepts_the_reference_with_its_gradients_and_keeps_the_global_seed():
    state = torch.random.get_rng_state()
    verdict = check_multi_head_module(make_module())
    assert verdict and "equals nn.MultiheadAttention" in verdict.message, verdict.message
    assert torch.equal(torch.random.get_rng_state(), state)


def test_module_reference_is_torch_multihead_attention_with_masks_and_non_zero_biases():
    for x, mask, h, seed in (case.values() for case in _module_cases()):
        m = _torch_module(x.shape[-1], h, seed, x.dtype)
        assert m.in_proj_bias.abs().sum() > 0 and m.out_proj.bias.abs().sum() > 0
        if mask is not None:                                # PyTorch's: (b * h, n, n), True = blocked
            mask_torch = ~(mask.repeat_interleave(h, dim=0) if mask.dim() == 3 else mask)
        expected = m(x, x, x, attn_mask=None if mask is None else mask_torch, need_weights=False)[0]
        ours = _build(_Reference, x, h, seed)(x, mask)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mistake, hint", _MODULE_MISTAKES, ids=range(len(_MODULE_MISTAKES)))
def test_module_rejects_known_mistakes_with_their_hint(mistake, hint):
    class WithMistake(_Reference):
        def __init__(self, d_model, num_heads):
            super().__init__(d_model, num_heads, **mistake)

    verdict = check_multi_head_module(WithMistake)
    assert not verdict and "\nHint: " + hint in verdict.message, verdict.message


@pytest.mark.parametrize("detach, named", [("q", "was the query detached"),
                                           ("k", "was the key detached"),
                                           ("qk", "was the query or the key detached"),
                                           ("qkv", "was the query or the key or the value detached")])
def test_module_a_detached_query_or_key_is_named_from_the_gradients(detach, named):
    """Same outputs, but W_Q (or W_K) would never train: one backward shows it."""
    verdict = check_multi_head_module(make_module(detach=detach))
    assert not verdict and "right output, but after one backward" in verdict.message, verdict.message
    assert named in verdict.message, verdict.message


def test_module_needs_its_fused_projection_and_the_class_itself():
    verdict = check_multi_head_module(make_module(projections=False))
    assert not verdict and "in_proj = nn.Linear(d_model, 3 * d_model)" in verdict.message
    assert "raised" not in verdict.message   # the checker's own complaint, not the learner's error

    class Stub(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            raise NotImplementedError

    assert check_multi_head_module(Stub).message == "Stub is not implemented yet."
    verdict = check_multi_head_module(make_module()(8, 2))         # an instance, not the class
    assert not verdict and "pass the class itself" in verdict.message


def _heads_by_hand(x, in_proj, h, mask, *, softmax):
    """Section 1's loop on the fused projection: each head's column block, one at a time."""
    d_head, heads = x.shape[-1] // h, []
    for i in range(h):
        q, k, v = (t[..., i * d_head:(i + 1) * d_head] for t in in_proj(x).chunk(3, dim=-1))
        if softmax == "course":
            heads.append(ah.scaled_dot_product_attention(q, k, v, mask)[0])
        else:                                                        # not the course's function
            s = q @ k.mT / math.sqrt(d_head)
            e = (s if mask is None else s.masked_fill(~mask, float("-inf"))).softmax(-1)
            heads.append(e @ v)
    return torch.cat(heads, dim=-1)


@pytest.mark.parametrize("softmax", ["course", "by hand"])
def test_module_refuses_a_loop_over_heads(softmax):
    """Section 1's loop over heads, fused: right, but refused (all heads in one call), any softmax."""

    class Loop(make_module()):
        def forward(self, x, mask=None):
            return self.out_proj(_heads_by_hand(x, self.in_proj, self.num_heads, mask,
                                                softmax=softmax))

    verdict = check_multi_head_module(Loop)
    assert not verdict and "attended head by head" in verdict.message, verdict.message
    assert "without a loop over heads" in verdict.message


def _fused(self, x, mask=None):       # torch's fused attention on (b, h, n, d_head)
    (b, n, d), h = x.shape, self.num_heads
    q, k, v = (t.reshape(b, n, h, d // h).transpose(1, 2) for t in self.in_proj(x).chunk(3, -1))
    if mask is not None and mask.dim() == 3:
        mask = mask[:, None]
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return self.out_proj(heads.transpose(1, 2).reshape(b, n, d))


def _folded(self, x, mask=None):      # the heads folded into the batch, (b * h, n, d_head)
    (b, n, d), h = x.shape, self.num_heads
    q, k, v = (t.reshape(b, n, h, d // h).transpose(1, 2).reshape(b * h, n, d // h)
               for t in self.in_proj(x).chunk(3, -1))
    if mask is not None:
        mask = mask.expand(b, n, n).repeat_interleave(h, dim=0)   # (b * h, n, n)
    heads, _ = ah.scaled_dot_product_attention(q, k, v, mask)
    return self.out_proj(heads.reshape(b, h, n, d // h).transpose(1, 2).reshape(b, n, d))


def _viewed(self, x, mask=None):      # .view after a transpose
    (b, n, d), h = x.shape, self.num_heads
    q, k, v = (t.view(b, n, h, d // h).transpose(1, 2) for t in self.in_proj(x).chunk(3, -1))
    heads, _ = ah.scaled_dot_product_attention(q, k, v, None if mask is None or mask.dim() == 2
                                               else mask[:, None])
    return self.out_proj(heads.transpose(1, 2).view(b, n, d))


@pytest.mark.parametrize("forward, words", [(_fused, "Passed"), (_folded, "Passed"),
                                            (_viewed, "no longer contiguous")])
def test_module_accepts_all_heads_at_once_by_other_routes_and_names_view(forward, words):
    verdict = check_multi_head_module(type("Answer", (make_module(),), {"forward": forward}))
    assert bool(verdict) == (words == "Passed") and words in verdict.message, verdict.message


def test_module_level_3_hint_is_a_skeleton_of_a_passing_forward():
    def module(fills):
        forward = skeleton("multi_head.module", "self, x, mask=None", fills, ah=ah)
        return type("FromHint", (make_module(),), {"forward": forward})

    assert not check_multi_head_module(module(None))
    assert check_multi_head_module(module((
        "t.reshape(b, n, h, d_model // h).transpose(1, 2)",
        "heads.transpose(1, 2).reshape(b, n, d_model)")))


# --- grouped-query attention ---------------------------------------------------------------


def test_gqa_level_3_hint_is_a_skeleton_that_calls_the_course_attention():
    fills = ("q.reshape(b, g, h // g * n_q, d_head)", "out.reshape(b, h, n_q, d_head)")
    assert_skeleton("multi_head.grouped_query", "q, k, v", check_grouped_query_attention, fills,
                    ah=ah)


def test_gqa_reference_equals_torch_enable_gqa_on_every_case():
    for case in _gqa_cases():
        expected = F.scaled_dot_product_attention(*case.values(), enable_gqa=True)
        assert torch.allclose(_gqa(*case.values()), expected, atol=1e-6)


def _as_rows(q, k, v):
    """Notebook 04's reference: each group's query heads as more query rows, a view of q."""
    b, h, n_q, d_head = q.shape
    g = k.shape[1]
    out, _ = ah.scaled_dot_product_attention(q.reshape(b, g, h // g * n_q, d_head), k, v)
    return out.reshape(b, h, n_q, d_head)


def _group_by_group(q, k, v):
    """A loop over the g groups: group j's heads as rows against k[:, j], a view."""
    b, h, n_q, d_head = q.shape
    g = k.shape[1]
    outs = [ah.scaled_dot_product_attention(q[:, j * h // g:(j + 1) * h // g].reshape(b, -1, d_head),
                                            k[:, j], v[:, j])[0] for j in range(g)]
    return torch.stack(outs, dim=1).reshape(b, h, n_q, d_head)


def _broadcast_by_hand(q, k, v):
    """The natural answer: a group axis, K and V broadcast through @ as views (matmul may still
    copy k5 to h heads inside itself, unseen: not the learner's copy; issue 32 wants it passing)."""
    b, h, n_q, d = q.shape
    g = k.shape[1]
    q5 = q.view(b, g, h // g, n_q, d)                       # (b, g, h/g, n_q, d): a view
    k5, v5 = k[:, :, None], v[:, :, None]                   # (b, g, 1, n_k, d): views
    weights = torch.softmax(q5 @ k5.mT / math.sqrt(d), dim=-1)
    return (weights @ v5).reshape(b, h, n_q, d)


def _broadcast(q, k, v):
    """The same through the course's attention."""
    out = ah.scaled_dot_product_attention(q.unflatten(1, (k.shape[1], -1)), k[:, :, None],
                                          v[:, :, None])[0]
    return out.flatten(1, 2)


@pytest.mark.parametrize("answer", [_as_rows, _group_by_group, _broadcast, _broadcast_by_hand])
def test_gqa_accepts_answers_whose_code_builds_no_h_head_copy_of_k_or_v(answer):
    verdict = check_grouped_query_attention(answer)
    assert verdict, verdict.message


@pytest.mark.parametrize("copy, built", [
    (lambda t, r: t.repeat_interleave(r, dim=1), "repeat_interleave built"),
    (lambda t, r: t[:, :, None].expand(-1, -1, r, -1, -1).reshape(
        t.shape[0], -1, *t.shape[2:]), "reshape built"),
    (lambda t, r: torch.cat([t[:, j:j + 1] for j in range(t.shape[1]) for _ in range(r)], dim=1),
     "cat built"),
    (lambda t, r: t[:, torch.arange(t.shape[1] * r) // r], "__getitem__ built"),
])
def test_gqa_refuses_keys_or_values_copied_to_every_query_head(copy, built):
    """Right values, K and V copied to h heads: refused on case 9 (the first decoding one), why."""
    def answer(q, k, v):
        r = q.shape[1] // k.shape[1]
        return ah.scaled_dot_product_attention(q, copy(k, r), copy(v, r))[0]

    verdict = check_grouped_query_attention(answer)
    assert not verdict and "on case 9 of 12" in verdict.message, verdict.message
    for words in (built, "copied to all h = 8 query heads", "b * h * n_k * d_head = 2 * 8 * 32 * 8",
                  "not g = 2", "reshaping an expanded K copies it"):
        assert words in verdict.message, (words, verdict.message)


def _tiled(q, k, v):                                          # k.repeat: the groups cycle
    r = q.shape[1] // k.shape[1]
    return ah.scaled_dot_product_attention(q, k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1))[0]


@pytest.mark.parametrize("answer, hint", [(m.produce, m.hint) for m in _GQA_MISTAKES]
                         + [(_tiled, _GQA_MISTAKES[0].hint)])
def test_gqa_rejects_known_mistakes_with_their_hint(answer, hint):
    """Named on the prefill cases, before a copy is refused on the decoding ones."""
    verdict = check_grouped_query_attention(answer)
    assert not verdict and "\nHint: " + hint in verdict.message, verdict.message


@pytest.mark.parametrize("key, answers", [
    ("multi_head.module", ("transpose(", "reshape(b", "head axis first", "[:, None]")),
    ("multi_head.grouped_query", ("reshape(b, g", "view(b, g", "unflatten", "flatten(",
                                  "h // g * n_q", "repeat_interleave", ".repeat(", "expand")),
])
def test_hints_before_the_skeleton_do_not_state_the_solution(key, answers):
    hints = exercises.EXERCISES[key].hints
    for fragment in answers:
        assert fragment not in hints[0] + hints[1], fragment
