r"""Checkers for notebook 08 (complexity): one FlashAttention tile update
(``complexity.tile_update``), merging the online-softmax states of two blocks of keys
(``complexity.merge_states``), and the bytes of a model's KV cache (``complexity.kv_cache_bytes``).

A state is the online softmax's ``(m, l, acc)``: ``m`` ``(..., n_q, 1)`` the running maximum of
the scores (``-inf`` before any key), ``l`` ``(..., n_q, 1)`` the sum of ``exp(s - m)`` and ``acc``
``(..., n_q, d_v)`` the sum of ``exp(s - m) v``; ``acc / l`` is the attention output.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch

from ..efficient import OnlineSoftmaxState, block_state, merge_states, online_softmax_step
from ..kv_cache import kv_cache_bytes
from .core import CheckResult, Mistake, as_number, check_function, seeded
from .workflow import exercise

__all__ = ["check_tile_update", "check_merge_states", "check_kv_cache_bytes",
           "tile_update_reference", "merge_states_reference", "kv_cache_bytes_reference"]

F64 = torch.float64
STATE = ("m (running max)", "l (running sum)", "acc (running output)")


def _stages(candidate, reference, stages, *, what, output_names, atol, rtol) -> CheckResult:
    """:func:`check_function` over groups ``(cases, mistakes, nan_hint)``, each with its own
    hints; the first miss is reported (numbered among all cases), else one verdict. A later
    group is reached only by answers that pass the earlier ones, where the known mistakes fail:
    it needs no mistakes, only its ``nan_hint``."""
    total, done = sum(len(cases) for cases, _, _ in stages), 0
    for cases, mistakes, nan_hint in stages:
        result = check_function(candidate, reference, cases, what=what, output_names=output_names,
                                mistakes=mistakes, nan_hint=nan_hint, atol=atol, rtol=rtol)
        if not result:
            return CheckResult(False, re.sub(r"on case (\d+) of \d+", lambda m, done=done: (
                f"on case {int(m[1]) + done} of {total}"), result.message, count=1))
        done += len(cases)
    return CheckResult(True, f"Passed: {what} matches the reference on all {total} cases, "
                             "edge cases included.")


# --- exercise 1: one FlashAttention tile --------------------------------------------------------


def tile_update_reference(m, l, acc, q, k, v):  # noqa: E741 - the paper's name
    """Fold the key tile ``k`` ``(..., b_k, d_k)``, ``v`` ``(..., b_k, d_v)`` into the state of the
    query tile ``q`` ``(..., b_q, d_k)``; scores ``q k^T / sqrt(d_k)``."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])       # (..., b_q, b_k)
    return tuple(online_softmax_step(OnlineSoftmaxState(m, l, acc), scores, v))


def _state_after(scores: torch.Tensor, values: torch.Tensor) -> tuple:
    return tuple(block_state(scores, values))


def _tile_cases() -> list[dict]:
    g = seeded(80)
    cases = []
    for batch, b_q, b_k, d_k, d_v, size, start in [
        ((), 4, 4, 8, 8, 1.0, "seen"), ((2, 3), 3, 5, 4, 6, 1.0, "seen"),
        ((), 1, 1, 2, 3, 1.0, "seen"), ((2,), 4, 3, 8, 2, 1.0, "empty"),
        ((), 3, 4, 16, 4, 12.0, "seen"),
    ]:
        def rand(*shape, g=g, batch=batch):
            return torch.randn(*batch, *shape, generator=g, dtype=F64)

        q, k, v = size * rand(b_q, d_k), size * rand(b_k, d_k), rand(b_k, d_v)
        if start == "empty":                                        # the first tile of a row
            m = torch.full((*batch, b_q, 1), -math.inf, dtype=F64)
            l, acc = torch.zeros_like(m), torch.zeros(*batch, b_q, d_v, dtype=F64)  # noqa: E741
        else:                                                       # after a tile of 3 keys
            old = rand(b_q, 3) * size * math.sqrt(d_k) / 4
            m, l, acc = _state_after(old, rand(3, d_v))  # noqa: E741
        cases.append({"m": m, "l": l, "acc": acc, "q": q, "k": k, "v": v})
    return cases


def _large_tile_cases() -> list[dict]:
    """Scores near 1000 (``exp`` overflows past 709), the old max below the tile's."""
    g = seeded(81)
    q, k = torch.randn(2, 8, generator=g, dtype=F64), torch.randn(3, 8, generator=g, dtype=F64)
    q[:, 0], k[:, 0] = 1000.0 * math.sqrt(8), 1.0                   # every score 1000 + noise
    m, l, acc = _state_after(999.0 + torch.randn(2, 3, generator=g, dtype=F64),  # noqa: E741
                             torch.randn(3, 4, generator=g, dtype=F64))
    return [{"m": m, "l": l, "acc": acc, "q": q, "k": k,
             "v": torch.randn(3, 4, generator=g, dtype=F64)}]


def _tile_with(m, l, acc, q, k, v, *, scale=None, rescale_l=True, rescale_acc=True,  # noqa: E741
               block_max=False, normalise=False, finish=False):
    """The tile update with one thing changed, for the known mistakes."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    c = torch.exp(m - m_new)
    p = torch.exp(s - (s.amax(-1, keepdim=True) if block_max else m_new))
    if normalise:
        p = p / p.sum(-1, keepdim=True)
    l_new = (c * l if rescale_l else l) + p.sum(-1, keepdim=True)
    acc_new = (c * acc if rescale_acc else acc) + p @ v
    return m_new, l_new, acc_new / l_new if finish else acc_new


@exercise("complexity.tile_update", "one FlashAttention tile: fold a key tile into the running "
          "state", hints=(
              "The tile's scores are q k^T / sqrt(d_k). The running max can only grow; whatever "
              "l and acc summed before was measured against the old max m, and must be re-expressed "
              "against the new one before the tile's own terms are added.",
              "s = q k^T / sqrt(d_k);  m' = max(m, max_j s_j);  p = exp(s - m');  "
              "l' = exp(m - m') l + sum_j p_j;  acc' = exp(m - m') acc + p v.",
              "s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
              "m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))\n"
              "c, p = torch.exp(m - m_new), torch.exp(s - m_new)\n"
              "return m_new, c * l + p.sum(dim=-1, keepdim=True), c * acc + p @ v"))
def check_tile_update(tile_update: Callable) -> CheckResult:
    """Exercise: ``tile_update(m, l, acc, q, k, v) -> (m, l, acc)``: ``m``, ``l`` ``(..., b_q, 1)``,
    ``acc`` ``(..., b_q, d_v)``, ``q`` ``(..., b_q, d_k)``, ``k`` ``(..., b_k, d_k)``, ``v``
    ``(..., b_k, d_v)``; the same shapes out."""
    mistakes = [
        Mistake(lambda *a: _tile_with(*a, scale=1.0),
                "the scores were not scaled: divide q k^T by sqrt(d_k), as in the attention formula."),
        Mistake(lambda *a: _tile_with(*a, scale=1 / a[3].shape[-1]),
                "the scores were divided by d_k; the scale is 1 / sqrt(d_k)."),
        Mistake(lambda *a: _tile_with(*a, scale=1 / math.sqrt(a[5].shape[-1])),
                "the scale used the values' width d_v; it is 1 / sqrt(d_k), the width of q and k."),
        Mistake(lambda *a: _tile_with(*a, rescale_acc=False),
                "l was rescaled but acc was not: acc's old terms were measured against the old "
                "max too, so acc needs the same factor exp(m - m_new) as l."),
        Mistake(lambda *a: _tile_with(*a, rescale_l=False, rescale_acc=False),
                "neither l nor acc was rescaled. When the max grows from m to m_new, every old "
                "term exp(s - m) must become exp(s - m_new): multiply both by exp(m - m_new)."),
        Mistake(lambda *a: _tile_with(*a, block_max=True),
                "the tile was exponentiated against its own max, but l and acc are kept against "
                "the running max m_new: use exp(s - m_new)."),
        Mistake(lambda *a: _tile_with(*a, normalise=True),
                "the tile's weights were normalised (a softmax over the tile) before being added: "
                "add the raw exp(s - m_new); the division by l comes once, after the last tile."),
        Mistake(lambda *a: _tile_with(*a, finish=True),
                "acc came back divided by l: that is the output so far, not the running state; "
                "keep acc unnormalised and divide only after the last tile."),
    ]
    overflow = ("exp of a large score overflows to inf: subtract the new running max m_new = "
                "max(m, max of the tile's scores) before exponentiating.")
    return _stages(tile_update, tile_update_reference,
                   [(_tile_cases(), mistakes, overflow), (_large_tile_cases(), [], overflow)],
                   what="tile_update", output_names=STATE, atol=1e-9, rtol=1e-7)


# --- exercise 2: merging two blocks' states -----------------------------------------------------


def merge_states_reference(m_a, l_a, acc_a, m_b, l_b, acc_b):
    """The state of the keys of both blocks, against ``m = max(m_a, m_b)``; a row that saw no key
    in either block stays ``(-inf, 0, 0)``."""
    return tuple(merge_states(OnlineSoftmaxState(m_a, l_a, acc_a), OnlineSoftmaxState(m_b, l_b, acc_b)))


def _two_blocks(g, batch, n_q, n_a, n_b, d_v, size=1.0, shift=0.0):
    def rand(*shape):
        return torch.randn(*batch, *shape, generator=g, dtype=F64)

    a = _state_after(size * rand(n_q, n_a), rand(n_a, d_v))
    b = _state_after(size * rand(n_q, n_b) + shift, rand(n_b, d_v))
    return dict(zip(("m_a", "l_a", "acc_a", "m_b", "l_b", "acc_b"), (*a, *b), strict=True))


def _merge_cases() -> list[dict]:
    g = seeded(82)
    cases = [_two_blocks(g, (), 6, 5, 3, 2),                    # either max the larger
             _two_blocks(g, (), 4, 5, 3, 2, shift=2.0),          # b's max is larger
             _two_blocks(g, (), 3, 4, 6, 3, shift=-2.0),         # a's max is larger
             _two_blocks(g, (2, 4), 3, 3, 5, 8, shift=0.0),      # batch and head dims
             _two_blocks(g, (), 1, 1, 1, 1),                     # one query, one key per block
             _two_blocks(g, (), 3, 4, 4, 2, size=300.0)]         # large logits
    empty = _two_blocks(g, (2,), 3, 3, 3, 4)                     # b: row 1 saw no key (causal)
    empty["m_b"][:, 1], empty["l_b"][:, 1], empty["acc_b"][:, 1] = -math.inf, 0.0, 0.0
    return cases + [empty]


def _empty_cases() -> list[dict]:
    case = _two_blocks(seeded(83), (), 3, 2, 2, 2)
    for side in "ab":                                            # row 2 saw no key at all
        case[f"m_{side}"][2], case[f"l_{side}"][2], case[f"acc_{side}"][2] = -math.inf, 0.0, 0.0
    return [case]


def _merge_with(m_a, l_a, acc_a, m_b, l_b, acc_b, *, m=None, factors=None, finish=False):
    m = torch.maximum(m_a, m_b) if m is None else m(m_a, m_b)
    ca, cb = (torch.exp(m_a - m), torch.exp(m_b - m)) if factors is None else factors(m_a, m_b, m)
    l = ca * l_a + cb * l_b  # noqa: E741
    acc = ca * acc_a + cb * acc_b
    return m, l, acc / l if finish else acc


def _merge_mistakes() -> list[Mistake]:
    def ones(m_a, m_b, m):
        return torch.ones_like(m), torch.ones_like(m)

    return [
        Mistake(lambda *a: _merge_with(*a, factors=ones),
                "l and acc were added as they are, but a's terms are measured against m_a and b's "
                "against m_b: bring both to m = max(m_a, m_b) first, multiplying a's by "
                "exp(m_a - m) and b's by exp(m_b - m)."),
        Mistake(lambda *a: _merge_with(*a, factors=lambda ma, mb, m: (torch.ones_like(m),
                                                                      torch.exp(mb - m))),
                "only b was rescaled: that is right only where a's max is the larger. Rescale both "
                "blocks, a by exp(m_a - m) and b by exp(m_b - m)."),
        Mistake(lambda *a: _merge_with(*a, factors=lambda ma, mb, m: (torch.exp(m - ma),
                                                                      torch.exp(m - mb))),
                "the factors are upside down: a term exp(s - m_a) becomes exp(s - m) when "
                "multiplied by exp(m_a - m), which is at most 1."),
        Mistake(lambda *a: _merge_with(*a, m=torch.minimum, factors=lambda ma, mb, m: (
                    torch.exp(ma - torch.maximum(ma, mb)), torch.exp(mb - torch.maximum(ma, mb)))),
                "the merged m must be the larger of the two maxima, max(m_a, m_b)."),
        Mistake(lambda *a: _merge_with(*a, finish=True),
                "acc came back divided by l: that is the merged output, not the merged state; "
                "keep acc unnormalised (a third block may still come)."),
        Mistake(lambda m_a, l_a, acc_a, m_b, l_b, acc_b: (
                    torch.maximum(m_a, m_b), (l_a + l_b) / 2, (acc_a / l_a + acc_b / l_b) / 2),
                "the two blocks' outputs were averaged: each block counts in proportion to its "
                "share of the softmax mass, exp(m_a - m) l_a against exp(m_b - m) l_b."),
    ]


@exercise("complexity.merge_states", "merge the online-softmax states of two blocks of keys",
          hints=(
              "Each block's l and acc are sums of exp(s - m_block): they are measured against "
              "different maxima. Pick the common reference m = max(m_a, m_b), move both blocks "
              "to it, and the sums simply add. A row that saw no key has m = -inf, l = 0, acc = 0.",
              "m = max(m_a, m_b);  l = exp(m_a - m) l_a + exp(m_b - m) l_b;  "
              "acc = exp(m_a - m) acc_a + exp(m_b - m) acc_b  (a factor is 0 where its m is -inf, "
              "including where m itself is -inf).",
              "m = torch.maximum(m_a, m_b)\n"
              "safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))   # no -inf - (-inf)\n"
              "ca, cb = torch.exp(m_a - safe), torch.exp(m_b - safe)\n"
              "return m, ca * l_a + cb * l_b, ca * acc_a + cb * acc_b"))
def check_merge_states(merge: Callable) -> CheckResult:
    """Exercise: ``merge_states(m_a, l_a, acc_a, m_b, l_b, acc_b) -> (m, l, acc)``, the state of the
    keys of two blocks (the same queries): ``m``, ``l`` ``(..., n_q, 1)``, ``acc``
    ``(..., n_q, d_v)``, in and out, with ``m = max(m_a, m_b)``."""
    mistakes = _merge_mistakes()
    return _stages(merge, merge_states_reference, [
        (_merge_cases(), mistakes, "a large m_a or m_b overflowed exp: use the factors "
                                   "exp(m_a - m) and exp(m_b - m), never exp(m_a) or exp(l)."),
        (_empty_cases(), [], "a row that saw no key in either block has m_a = m_b = m = "
                                   "-inf, and exp(-inf - (-inf)) is NaN: such a row must stay "
                                   "m = -inf, l = 0, acc = 0 (subtract 0 instead of m where m "
                                   "is -inf)."),
    ], what="merge_states", output_names=STATE, atol=1e-9, rtol=1e-7)


# --- exercise 3: the KV cache of a model --------------------------------------------------------


def kv_cache_bytes_reference(n_tokens, num_layers, num_heads, num_kv_heads, head_dim, dtype):
    """Bytes of the keys and values of ``n_tokens`` positions, every layer, ``num_kv_heads``
    heads of ``head_dim`` numbers each, in ``dtype`` (``num_heads``, the query heads, do not
    count)."""
    return kv_cache_bytes(n_tokens, num_layers=num_layers, num_kv_heads=num_kv_heads,
                          head_dim=head_dim, bytes_per_value=torch.empty((), dtype=dtype).element_size())


#: ``(n_tokens, num_layers, num_heads, num_kv_heads, head_dim, dtype)``: the attention shapes
#: of Llama 2 7B, Llama 3 8B and Llama 2/3 70B as published in their configurations, a
#: MiniLM-sized float32 model first (bytes against numbers tell apart there), one-token MQA.
KV_MODELS = [
    (2048, 6, 12, 12, 32, torch.float32),         # all-MiniLM-L6-v2-sized, float32
    (4096, 32, 32, 32, 128, torch.float16),       # Llama 2 7B: multi-head, 32 KV heads
    (8192, 32, 32, 8, 128, torch.bfloat16),       # Llama 3 8B: grouped-query, 8 KV heads
    (32768, 80, 64, 8, 128, torch.bfloat16),      # Llama 2/3 70B
    (1, 1, 4, 1, 64, torch.float64),              # multi-query, one token
]


BYTES = "expected a number of bytes"


@exercise("complexity.kv_cache_bytes", "the KV-cache bytes of a model", hints=(
    "Every generated token leaves one key and one value vector in every layer, for every key/value "
    "head (not every query head, under grouped-query attention); each number takes the bytes of "
    "the dtype.",
    "bytes = 2 (K and V) x layers x KV heads x head_dim x bytes per number x tokens.",
    "size = torch.empty((), dtype=dtype).element_size()\n"
    "return 2 * num_layers * num_kv_heads * head_dim * size * n_tokens"))
def check_kv_cache_bytes(cache_bytes: Callable) -> CheckResult:
    """Exercise: ``kv_cache_bytes(n_tokens, num_layers, num_heads, num_kv_heads, head_dim, dtype)
    -> int``, the bytes of one sequence's KV cache."""
    cases = [dict(zip(("n_tokens", "num_layers", "num_heads", "num_kv_heads", "head_dim", "dtype"),
                      model, strict=True)) for model in KV_MODELS]

    def wrong(formula):
        return as_number(lambda n, layers, heads, kv, d, dtype: formula(
            n, layers, heads, kv, d, torch.empty((), dtype=dtype).element_size()), BYTES)

    return check_function(as_number(cache_bytes, BYTES), as_number(kv_cache_bytes_reference, BYTES),
                          cases,
                          what="kv_cache_bytes", output_names=("the number of bytes",), mistakes=[
        Mistake(wrong(lambda n, L, h, kv, d, size: L * kv * d * size * n),
                "that counts the keys only: the cache holds a value vector beside every key, so "
                "multiply by 2."),
        Mistake(wrong(lambda n, L, h, kv, d, size: 2 * L * h * d * size * n),
                "you counted the query heads (num_heads); only the key/value heads are cached, "
                "num_kv_heads of them (grouped-query attention shares each among several queries)."),
        Mistake(wrong(lambda n, L, h, kv, d, size: 2 * L * kv * d * 4 * n),
                "you assumed 4 bytes per number; float16 and bfloat16 take 2, float64 takes 8: "
                "torch.empty((), dtype=dtype).element_size() gives the size of any dtype."),
        Mistake(wrong(lambda n, L, h, kv, d, size: 2 * L * kv * d * n),
                "that is the number of cached numbers, not of bytes: multiply by the bytes per "
                "number of the dtype."),
        Mistake(wrong(lambda n, L, h, kv, d, size: 2 * kv * d * size * n),
                "that is one layer's cache: every layer keeps its own keys and values."),
        Mistake(wrong(lambda n, L, h, kv, d, size: 2 * L * kv * d * size),
                "that is the cache of one token: multiply by the number of tokens."),
        Mistake(wrong(lambda n, L, h, kv, d, size: 2 * L * kv * d * size * n * 8),
                "that is a number of bits: a byte is 8 bits, and element_size() is already in "
                "bytes."),
    ], atol=0.0, rtol=0.0)
