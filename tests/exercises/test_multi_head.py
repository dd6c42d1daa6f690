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
    _gqa,
    _gqa_cases,
    _module_cases,
    _reference,
    check_grouped_query_attention,
    check_multi_head_module,
)

# --- the multi-head attention module ---------------------------------------------------------


def make_module(*, split="right", merge="right", d_scale="head", dim=-1, mix=True, mask_use="right",
                trainable=True, projections=True, fused="right", mask_heads=True, detach=""):
    """A learner's MultiHeadSelfAttention (fused in_proj), right or with one mistake."""

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
            qkv = self.in_proj(x)
            if fused == "per head":
                q, k, v = (t.reshape(b, n, d_model)
                           for t in qkv.reshape(b, n, h, 3 * d_head).chunk(3, dim=-1))
            elif fused == "k q v":
                k, q, v = qkv.chunk(3, dim=-1)
            else:
                q, k, v = qkv.chunk(3, dim=-1)

            def to_heads(t):                            # (b, n, d_model) -> (b, h, n, d_head)
                if split == "reshape only":
                    return t.reshape(b, h, n, d_head)
                if split == "strided":
                    return t.reshape(b, n, d_head, h).permute(0, 3, 1, 2)
                return t.reshape(b, n, h, d_head).transpose(1, 2)

            q, k, v = to_heads(q), to_heads(k), to_heads(v)
            q = q.detach() if "q" in detach else q
            k = k.detach() if "k" in detach else k
            if not trainable:
                q, k, v = q.detach(), k.detach(), v.detach()
            if mask is not None and mask.dim() == 3 and mask_heads:
                mask = mask[:, None]
            scale = {"head": d_head, "model": d_model, "none": 1, "twice": d_head**2}[d_scale]**-0.5
            s = q @ k.transpose(-2, -1) * scale
            if mask is not None and mask_use in ("right", "zeros"):
                s = s.masked_fill(~mask, float("-inf") if mask_use == "right" else 0.0)
            elif mask is not None and mask_use == "inverted":    # torch's convention, not ours
                s = s.masked_fill(mask, float("-inf"))
            if mask is not None and mask_use == "inverted, zeros":
                heads, _ = ah.scaled_dot_product_attention(q, k, v, ~mask)
            else:
                heads = torch.softmax(s, dim=dim) @ v
            if merge == "reshape only":
                concat = heads.reshape(b, n, d_model)
            elif merge == "strided":                    # head i to every h-th column
                concat = heads.permute(0, 2, 3, 1).reshape(b, n, d_model)
            elif merge == "reversed heads":             # head h-1 in the first columns
                concat = heads.flip(1).transpose(1, 2).reshape(b, n, d_model)
            elif merge == "reversed columns":           # a flip of the merged columns
                concat = heads.transpose(1, 2).reshape(b, n, d_model).flip(-1)
            else:
                concat = heads.transpose(1, 2).reshape(b, n, d_model)
            out = self.out_proj(concat) if mix else concat
            return out.detach() if not trainable else out

    return Module


def test_module_accepts_the_reference_with_its_gradients():
    verdict = check_multi_head_module(make_module())
    assert verdict and "MultiheadAttention" in verdict.message and "so are its gradients" in (
        verdict.message), verdict.message


def test_module_reference_is_torch_multihead_attention_with_masks_and_non_zero_biases():
    """The checker's reference is PyTorch's module; ours, built from it, agrees (mask convention)."""
    from attn_helpers.exercises.multi_head import _torch_module
    for case in _module_cases():
        x, mask, h, seed = case.values()
        m = _torch_module(x.shape[-1], h, seed, x.dtype)
        assert m.in_proj_bias.abs().sum() > 0 and m.out_proj.bias.abs().sum() > 0
        expected = _reference(*case.values())
        assert torch.isfinite(expected).all() and expected.shape == x.shape
        ours = ah.MultiHeadAttention.from_torch(m)
        torch.testing.assert_close(ours(x, x, x, mask)[0].detach(), expected, atol=1e-5, rtol=1e-4)


def test_module_check_does_not_move_the_global_seed():
    state = torch.random.get_rng_state()
    check_multi_head_module(make_module())
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("mistake, words", [
    ({"fused": "per head"}, "not [q k v] per head"),
    ({"fused": "k q v"}, "Q and K are swapped"),
    ({"split": "reshape only"}, "mixes positions into heads"),
    ({"split": "reshape only", "merge": "reshape only"}, "(and merged back the same way)"),
    ({"split": "strided"}, "split on the wrong axis, from the wrong end"),
    ({"split": "strided", "merge": "strided"}, "split and merged from the wrong end"),
    ({"merge": "reshape only"}, "merged in the wrong order"),
    ({"merge": "strided"}, "merged on the wrong axis, from the wrong end"),
    ({"merge": "reversed heads"}, "the heads come back in reverse order"),
    ({"merge": "reversed columns"}, "the merged columns are in reverse order"),
    ({"d_scale": "none"}, "scale is missing"),
    ({"d_scale": "model"}, "not 1/sqrt(d_model)"),
    ({"d_scale": "twice"}, "scaled twice"),
    ({"mix": False}, "W_O is missing"),
    ({"mask_use": "inverted"}, "the mask is inverted"),
    ({"mask_use": "inverted, zeros"}, "the mask is inverted"),
    ({"mask_use": "ignored"}, "the mask was ignored"),
    ({"mask_use": "zeros"}, "masked scores set to 0, not -inf"),
    ({"mask_heads": False}, "mask[:, None]"),
    ({"dim": -2}, "softmax runs over the wrong axis"),
])
def test_module_rejects_known_mistakes_with_their_hint(mistake, words):
    verdict = check_multi_head_module(make_module(**mistake))
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


def test_module_must_be_trainable_and_have_its_fused_projection():
    verdict = check_multi_head_module(make_module(trainable=False))
    assert not verdict and "after one backward" in verdict.message, verdict.message
    verdict = check_multi_head_module(make_module(projections=False))
    assert not verdict and "in_proj = nn.Linear(d_model, 3 * d_model)" in verdict.message


def _heads_by_hand(x, in_proj, h, mask, *, softmax):
    """Section 1's loop on the fused projection: each head's column block, one at a time."""
    d_head = x.shape[-1] // h
    q, k, v = in_proj(x).chunk(3, dim=-1)
    heads = []
    for i in range(h):
        cols = slice(i * d_head, (i + 1) * d_head)
        if softmax == "course":
            heads.append(ah.scaled_dot_product_attention(q[..., cols], k[..., cols], v[..., cols],
                                                         mask)[0])
            continue
        s = q[..., cols] @ k[..., cols].transpose(-2, -1) / math.sqrt(d_head)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        e = (s - s.amax(-1, keepdim=True)).exp()                     # a hand-written softmax
        heads.append(e / e.sum(-1, keepdim=True) @ v[..., cols])
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


def test_module_accepts_all_heads_at_once_by_other_routes():
    """Torch's fused attention on (b, h, n, d_head), or the heads folded into (b * h, n, d_head)."""

    class Fused(make_module()):
        def forward(self, x, mask=None):
            (b, n, d), h = x.shape, self.num_heads
            q, k, v = (t.reshape(b, n, h, d // h).transpose(1, 2) for t in self.in_proj(x).chunk(3, -1))
            if mask is not None and mask.dim() == 3:
                mask = mask[:, None]
            heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.out_proj(heads.transpose(1, 2).reshape(b, n, d))

    class Folded(make_module()):
        def forward(self, x, mask=None):
            (b, n, d), h = x.shape, self.num_heads
            q, k, v = (t.reshape(b, n, h, d // h).transpose(1, 2).reshape(b * h, n, d // h)
                       for t in self.in_proj(x).chunk(3, -1))
            if mask is not None:
                mask = mask.expand(b, n, n).repeat_interleave(h, dim=0)   # (b * h, n, n)
            heads, _ = ah.scaled_dot_product_attention(q, k, v, mask)
            return self.out_proj(heads.reshape(b, h, n, d // h).transpose(1, 2).reshape(b, n, d))

    for module in (Fused, Folded):
        verdict = check_multi_head_module(module)
        assert verdict, verdict.message


def test_module_names_view_after_transpose():
    class Viewed(make_module()):
        def forward(self, x, mask=None):
            (b, n, d), h = x.shape, self.num_heads
            q, k, v = (t.view(b, n, h, d // h).transpose(1, 2) for t in self.in_proj(x).chunk(3, -1))
            heads, _ = ah.scaled_dot_product_attention(q, k, v, None if mask is None or mask.dim() == 2
                                                       else mask[:, None])
            return self.out_proj(heads.transpose(1, 2).view(b, n, d))

    verdict = check_multi_head_module(Viewed)
    assert not verdict and "no longer contiguous" in verdict.message, verdict.message


def test_module_stub_and_non_class():
    class Stub(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            raise NotImplementedError

    assert check_multi_head_module(Stub).message == "Stub is not implemented yet."
    verdict = check_multi_head_module(make_module()(8, 2))         # an instance, not the class
    assert not verdict and "pass the class itself" in verdict.message


def test_module_level_3_hint_is_a_skeleton_of_a_passing_forward():
    def module(fills):
        forward = skeleton("multi_head.module", "self, x, mask=None", fills, ah=ah)
        return type("FromHint", (make_module(),), {"forward": forward})

    assert not check_multi_head_module(module(None))
    assert check_multi_head_module(module((
        "t.reshape(b, n, h, d_model // h).transpose(1, 2)",
        "heads.transpose(1, 2).reshape(b, n, d_model)")))


def test_gqa_level_3_hint_is_a_skeleton_that_calls_the_course_attention():
    fills = ("q.reshape(b, g, h // g * n_q, d_head)", "out.reshape(b, h, n_q, d_head)")
    assert_skeleton("multi_head.grouped_query", "q, k, v", check_grouped_query_attention, fills,
                    ah=ah)


def grouped_query_attention(q, k, v, *, share="interleave", scale=None, dim=-1):
    """A learner who copies the key/value heads to all h query heads (right, or with a mistake)."""
    h, g, d_head = q.shape[1], k.shape[1], q.shape[-1]
    if share == "interleave":
        k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
    elif share == "repeat":
        k, v = k.repeat(1, h // g, 1, 1), v.repeat(1, h // g, 1, 1)
    elif share == "first":
        k, v = k[:, :1], v[:, :1]
    scale = 1 / math.sqrt(d_head) if scale is None else scale
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=dim) @ v


def _as_rows(q, k, v):
    """Notebook 04's reference: each group's query heads as more query rows, a view of q."""
    b, h, n_q, d_head = q.shape
    g = k.shape[1]
    out, _ = ah.scaled_dot_product_attention(q.reshape(b, g, h // g * n_q, d_head), k, v)
    return out.reshape(b, h, n_q, d_head)


def _by_hand(q, k, v):
    """The same rows, the attention written out (no call of the course's function)."""
    b, h, n_q, d_head = q.shape
    rows = q.view(b, k.shape[1], -1, d_head)
    weights = torch.softmax(rows @ k.transpose(-2, -1) / math.sqrt(d_head), dim=-1)
    return (weights @ v).view(b, h, n_q, d_head)


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


@pytest.mark.parametrize("answer", [_as_rows, _by_hand, _group_by_group, _broadcast,
                                    _broadcast_by_hand])
def test_gqa_accepts_answers_whose_code_builds_no_h_head_copy_of_k_or_v(answer):
    verdict = check_grouped_query_attention(answer)
    assert verdict, verdict.message


def test_gqa_reference_equals_torch_enable_gqa_on_every_case():
    for case in _gqa_cases():
        expected = F.scaled_dot_product_attention(*case.values(), enable_gqa=True)
        assert torch.allclose(_gqa(*case.values()), expected, atol=1e-6)


@pytest.mark.parametrize("detach, named", [("q", "was the query detached"),
                                           ("k", "was the key detached"),
                                           ("qk", "was the query or the key detached")])
def test_module_a_detached_query_or_key_is_named_from_the_gradients(detach, named):
    """Same outputs, but W_Q (or W_K) would never train: one backward shows it."""
    verdict = check_multi_head_module(make_module(detach=detach))
    assert not verdict and "right output, but after one backward" in verdict.message, verdict.message
    assert named in verdict.message, verdict.message


def _copy_then_attend(copy):
    def answer(q, k, v):
        r = q.shape[1] // k.shape[1]
        return ah.scaled_dot_product_attention(q, copy(k, r), copy(v, r))[0]

    return answer


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
    verdict = check_grouped_query_attention(_copy_then_attend(copy))
    assert not verdict and "on case 9 of 12" in verdict.message, verdict.message
    for words in (built, "copied to all h = 8 query heads", "b * h * n_k * d_head = 2 * 8 * 32 * 8",
                  "not g = 2", "Views, which copy nothing, are fine"):
        assert words in verdict.message, (words, verdict.message)


def _i_over_g(q, k, v):
    index = torch.tensor([min(i // k.shape[1], k.shape[1] - 1) for i in range(q.shape[1])])
    return grouped_query_attention(q, k[:, index], v[:, index], share="none")


def _rows_mixed(q, k, v):                                    # n_q moved in front of the heads
    b, h, n_q, d = q.shape
    rows = q.transpose(1, 2).reshape(b, k.shape[1], -1, d)
    out = ah.scaled_dot_product_attention(rows, k, v)[0]
    return out.reshape(b, n_q, h, d).transpose(1, 2)


@pytest.mark.parametrize("answer, words", [
    (lambda q, k, v: grouped_query_attention(q, k, v, share="repeat"), "cycles through the key/value"),
    (lambda q, k, v: grouped_query_attention(q, k, v, share="first"), "every query head read the first"),
    (lambda q, k, v: grouped_query_attention(q, k, v, scale=1.0), "not scaled"),
    (lambda q, k, v: grouped_query_attention(q, k, v, scale=1 / math.sqrt(q.shape[1] * q.shape[-1])),
     "not by 1/sqrt(h * d_head)"),
    (lambda q, k, v: grouped_query_attention(q, k, v, dim=-2), "wrong axis"),
    (_i_over_g, "not i // g"),
    (_rows_mixed, "mix positions and heads"),
])
def test_gqa_rejects_known_mistakes_with_their_hint(answer, words):
    """Named on the prefill cases, before a copy is refused on the decoding ones."""
    verdict = check_grouped_query_attention(answer)
    assert not verdict and "\nHint: " in verdict.message and words in verdict.message, verdict.message


def test_gqa_names_a_tiled_repeat_as_the_order_and_the_copy_it_is():
    """k.repeat(1, h/g, 1, 1) cycles the groups, so its values fail first (on a prefill case):
    the hint names the tiling and that it copies K and V to all h heads."""
    def tiled(q, k, v):
        r = q.shape[1] // k.shape[1]
        return ah.scaled_dot_product_attention(q, k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1))[0]

    verdict = check_grouped_query_attention(tiled)
    assert not verdict and "\nHint: " in verdict.message, verdict.message
    for words in ("cycles through the key/value", "k.repeat(1, h // g, 1, 1)", "copy of K and V"):
        assert words in verdict.message, (words, verdict.message)


def test_gqa_names_averaged_heads():
    verdict = check_grouped_query_attention(                 # one output per group: wrong shape
        lambda q, k, v: grouped_query_attention(q.unflatten(1, (k.shape[1], -1)).mean(2), k, v))
    assert not verdict and "with shape" in verdict.message


@pytest.mark.parametrize("key, answers", [
    ("multi_head.module", ("transpose(", "reshape(b", "head axis first", "[:, None]")),
    ("multi_head.grouped_query", ("reshape(b, g", "view(b, g", "unflatten", "flatten(",
                                  "h // g * n_q", "repeat_interleave", ".repeat(", "expand")),
])
def test_hints_before_the_skeleton_do_not_state_the_solution(key, answers):
    hints = exercises.EXERCISES[key].hints
    for fragment in answers:
        assert fragment not in hints[0] + hints[1], fragment
