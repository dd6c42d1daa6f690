"""Checkers for notebook 05 (masking): a batched causal sliding-window mask for LEFT-padded
sentences (the library's mask builders blocked while it runs), and one step of a KV cache, which
over a whole sequence must equal full causal attention."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask
from .core import CheckResult, Mistake, check_function, refusing_ops, seeded
from .workflow import exercise

__all__ = ["check_window_mask", "check_kv_cache_step"]

#: Right with its default arguments, so a learner's function may not call it while it is checked
#: (see ``core.check_function``): it builds the known mistakes of exercise 1.
REFUSED_WHILE_CHECKING = ("left_padded_window_mask",)


# --- exercise 1: a batched sliding-window mask for left-padded sequences ----------------------


def _as_bool_mask(fn: Callable) -> Callable:
    """Masks are bool; the comparison machinery wants floats. Non-bool answers are reported."""
    if not callable(fn):
        return fn

    def wrapped(*args):
        out = fn(*args)
        if isinstance(out, torch.Tensor) and out.dtype != torch.bool:
            raise TypeError(f"the mask must be a bool tensor (True = may attend), got dtype {out.dtype}")
        return out.double() if isinstance(out, torch.Tensor) else out

    return wrapped


def _offsets(n: int) -> torch.Tensor:
    return torch.arange(n)[:, None] - torch.arange(n)[None, :]       # i - j, (n, n)


def left_padded_window_mask(lengths: torch.Tensor, n: int, window: int, *, left: bool = True,
                            both_ways: bool = False, reach: int = 0, keys: bool = True,
                            windowed: bool = True, pads_see_themselves: bool = False,
                            one_length: bool = False, transpose: bool = False) -> torch.Tensor:
    """The answer of exercise 1, ``(b, n, n)`` bool: sentence ``b`` has its ``lengths[b]`` real
    tokens at the END (positions ``n - lengths[b] .. n - 1``); query ``i`` may attend to key ``j``
    when ``j`` is a real token and ``0 <= i - j < window``. The keyword arguments build the known
    mistakes (all off: the right answer)."""
    if one_length:
        lengths = lengths[:1].expand(len(lengths))
    positions = torch.arange(n)
    start = n - lengths[:, None] if left else None                      # (b, 1): first real slot
    real = positions[None, :] >= start if left else positions[None, :] < lengths[:, None]  # (b, n)
    offset = _offsets(n)
    local = offset.abs() < window if both_ways else (offset >= 0) & (offset < window + reach)
    if not windowed:
        local = offset >= 0
    visible = (real[:, None, :] if keys else real[:, :, None]) & local   # (b, n, n)
    if pads_see_themselves:
        visible = visible | (torch.eye(n, dtype=torch.bool) & ~real[:, :, None])
    return visible.transpose(-2, -1) if transpose else visible


def _window_cases() -> list[dict]:
    return [{"lengths": torch.tensor(lengths), "n": n, "window": w} for lengths, n, w in [
        ([5, 3, 1], 5, 2), ([4, 2], 4, 1), ([7, 4, 0], 7, 3), ([3], 3, 5), ([2, 6, 5], 6, 6),
        ([1], 1, 1)]]


def _mask_functions():
    """The library's mask builders: they would do exercise 1 for the learner, so the checker
    blocks them (in the package and in ``attn_helpers.masks``)."""
    import importlib

    owners = (importlib.import_module("attn_helpers"), importlib.import_module("attn_helpers.masks"))
    names = ("causal_mask", "padding_mask", "sliding_window_mask", "key_padding_to_attention_mask")
    return [(owner, name) for owner in owners for name in names]


def _window_mistake(hint: str, **flaw) -> Mistake:
    return Mistake(lambda lengths, n, w: left_padded_window_mask(lengths, n, w, **flaw).double(), hint)


@exercise("masking.window_mask", "a sliding-window mask for a left-padded batch", hints=(
    "Batched generation pads on the LEFT: sentence b's real tokens are its last lengths[b] "
    "positions. A key is visible when it is a real token AND inside query i's causal window. A "
    "pad query's window holds only pads, so its row is all False; leave it so.",
    "Build two conditions and combine them with AND: which positions of sentence b are real, "
    "with padding on the left, and which offsets i - j lie inside a causal window of size "
    "window? One depends on (b, j), the other on (i, j): give the first the missing query axis "
    "so that they broadcast to (b, n, n).",
    "j = torch.arange(n)\n"
    "real = ...                         # (b, n): True at sentence b's last lengths[b] positions\n"
    "offset = j[:, None] - j[None, :]   # i - j, (n, n)\n"
    "return ...                         # (b, n, n): real[:, None, :] AND the causal window on offset"))
def check_window_mask(window_mask: Callable) -> CheckResult:
    """Exercise: ``window_mask(lengths (b,), n, window) -> (b, n, n) bool``, for LEFT-padded
    sentences (real tokens at positions ``n - lengths[b] .. n - 1``): True where key ``j`` is real
    and ``0 <= i - j < window``. The library's mask builders are blocked while it runs."""
    return check_function(
        _as_bool_mask(window_mask),
        lambda lengths, n, w: left_padded_window_mask(lengths, n, w).double(),
        _window_cases(), what="window_mask", output_names=("the mask",), forbid=_mask_functions(),
        mistakes=[
            _window_mistake("the real tokens were taken at the start (right padding: j < length); "
                            "a LEFT-padded sentence has its real tokens at the end, j >= n - "
                            "length.", left=False),
            _window_mistake("your window looks both ways; a causal window sees only the present "
                            "and the past: require i - j >= 0 as well.", both_ways=True),
            _window_mistake("off by one: with window w each query sees itself and the w - 1 keys "
                            "before it, so the condition is i - j < w, not i - j <= w.", reach=1),
            _window_mistake("each sentence's mask is transposed: rows are queries i, columns are "
                            "keys j, and a query looks back, at keys j <= i.", transpose=True),
            _window_mistake("the padding was applied to the queries (rows) instead of the keys "
                            "(columns): a real query must not see a pad key inside its window.",
                            keys=False),
            _window_mistake("that is causal + padding with no window: also hide the keys that are "
                            "window or more positions back.", windowed=False),
            _window_mistake("every sentence got the first sentence's length: real[b, j] depends on "
                            "lengths[b], one length per sentence.", one_length=True),
            _window_mistake("pad queries were allowed to see themselves. Leave a pad query's row "
                            "all False: nothing reads its output, and the attention step turns an "
                            "empty row into zeros (section 4).", pads_see_themselves=True),
            Mistake(lambda lengths, n, w: (~left_padded_window_mask(lengths, n, w)).double(),
                    "the mask is inverted: True means 'may attend'."),
        ],
    )


# --- exercise 2: one KV-cache step ------------------------------------------------------------


def _kv_cases() -> list[dict]:
    """q, k, v of a whole sequence, and preallocated caches for ``n + 3`` positions whose slots
    hold garbage (as ``torch.empty`` would) until a step writes them."""
    g = seeded(51)
    rand = tuple(int(i) for i in torch.randint(1, 6, (5,), generator=g))           # random shape
    cases = []
    for b, h, n, d_k, d_v, dtype in [(1, 1, 5, 4, 3, torch.float32), (2, 3, 6, 4, 4, torch.float32),
                                     (1, 2, 1, 3, 2, torch.float32), (2, 2, 7, 8, 5, torch.float64),
                                     (*rand, torch.float32)]:
        def randn(*size, dtype=dtype):
            return torch.randn(*size, generator=g, dtype=dtype)

        cases.append({"q": randn(b, h, n, d_k), "k": randn(b, h, n, d_k), "v": randn(b, h, n, d_v),
                      "k_cache": 5 * randn(b, h, n + 3, d_k), "v_cache": 5 * randn(b, h, n + 3, d_v)})
    return cases


def _full_causal(q, k, v, k_cache, v_cache):
    """Full causal attention over the sequence; the caches end up holding k and v."""
    n = q.shape[-2]
    return scaled_dot_product_attention(q, k, v, causal_mask(n))[0], k, v


def _decode(step: Callable) -> Callable:
    """Run ``step(k_cache, v_cache, t, q_t, k_t, v_t)`` for t = 0..n-1 on copies of the caches;
    return the n outputs side by side, and the first n slots of each cache."""

    def run(q, k, v, k_cache, v_cache):
        k_cache, v_cache = k_cache.clone(), v_cache.clone()
        n = q.shape[-2]
        outputs = []
        for t in range(n):
            out = step(k_cache, v_cache, t, q[..., t:t + 1, :], k[..., t:t + 1, :], v[..., t:t + 1, :])
            if out is None:
                return None
            if not isinstance(out, torch.Tensor) or out.shape != v[..., t:t + 1, :].shape:
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(f"at step t={t} the output should have shape "
                                 f"{tuple(v[..., t:t + 1, :].shape)} (b, h, 1, d_v), got {got}")
            outputs.append(out)
        return torch.cat(outputs, dim=-2), k_cache[..., :n, :], v_cache[..., :n, :]

    return run


def _wrong_step(visible: Callable, *, write_at=0, scale=None, dim=-1, write_v=True) -> Callable:
    """A cache step with one known mistake, for the checker's hints: writes slot ``t + write_at``
    (the value too unless ``write_v`` is False) and attends to slots ``start..stop-1``, where
    ``start, stop = visible(t, n_max)``."""

    def step(k_cache, v_cache, t, q_t, k_t, v_t):
        k_cache[..., t + write_at, :] = k_t[..., 0, :]
        if write_v:
            v_cache[..., t + write_at, :] = v_t[..., 0, :]
        start, stop = visible(t, k_cache.shape[-2])
        keys, values = k_cache[..., start:stop, :], v_cache[..., start:stop, :]
        c = 1 / math.sqrt(q_t.shape[-1]) if scale is None else scale
        if keys.shape[-2] == 0:
            return torch.zeros_like(v_t)
        return torch.softmax(q_t @ keys.transpose(-2, -1) * c, dim=dim) @ values

    return step


def _cache_helpers():
    """The course's cache, which would do exercise 2's bookkeeping for the learner, is blocked;
    so is torch's fused attention, as in notebooks 02, 04 and 08. The course's own attention
    (``ah.scaled_dot_product_attention``, notebook 02's exercise) is allowed: the skill here is
    the cache."""
    import importlib

    from .. import kv_cache

    return [(kv_cache.KVCache, "append"), (kv_cache.KVCache, "attend"),
            (kv_cache, "decode_with_cache"),
            (importlib.import_module("attn_helpers"), "decode_with_cache"),
            (torch.nn.functional, "scaled_dot_product_attention")]


def _right_visible(t, n_max):
    return 0, t + 1


def _unwritten_step(k_cache, v_cache, t, q_t, k_t, v_t):
    """The caches are never written: the new key and value are concatenated to slots 0..t-1, which
    no step wrote (garbage), so the outputs are wrong from step 1 on, and the caches too."""
    keys = torch.cat([k_cache[..., :t, :], k_t], dim=-2)
    values = torch.cat([v_cache[..., :t, :], v_t], dim=-2)
    return scaled_dot_product_attention(q_t, keys, values)[0]


@exercise("masking.kv_cache_step", "one KV-cache step", hints=(
    "The cache already holds the keys and values of positions 0..t-1. Store the new token's key "
    "and value in slot t, then let its query attend to every slot filled so far, and to none of "
    "the slots after it, which hold garbage. The attention itself is notebook 02's: call "
    "ah.scaled_dot_product_attention.",
    "Let the shapes guide you: a cache is (b, h, n_max, d) and the new key (b, h, 1, d), so "
    "mind that length-1 axis when you write slot t. Then: which slots may the query see, and "
    "if you hand the attention only those, does it still need a mask?",
    "k_cache[:, :, t] = ...                   # slot t gets the new key, (b, h, d_k)\n"
    "v_cache[:, :, t] = ...                   # and the new value, (b, h, d_v)\n"
    "keys = ...                              # the filled slots 0..t: (b, h, t + 1, d_k)\n"
    "values = ...                            # the same slots of v_cache\n"
    "out, _ = ah.scaled_dot_product_attention(q_t, keys, values)\n"
    "return out                              # (b, h, 1, d_v)"))
def check_kv_cache_step(kv_cache_step: Callable) -> CheckResult:
    """Exercise: ``kv_cache_step(k_cache (b, h, n_max, d_k), v_cache (b, h, n_max, d_v), t,
    q_t (b, h, 1, d_k), k_t (b, h, 1, d_k), v_t (b, h, 1, d_v)) -> (b, h, 1, d_v)``: writes
    ``k_t`` and ``v_t`` into slot ``t`` of the preallocated caches, in place, and attends with
    ``q_t`` to slots ``0..t``. Run for ``t = 0..n-1`` it must equal full causal attention. It may
    call the course's ``ah.scaled_dot_product_attention``; the course's cache and torch's fused
    attention are blocked."""
    if not callable(kv_cache_step):
        return CheckResult(False, "Not yet: kv_cache_step is not a function "
                                  f"(got {type(kv_cache_step).__name__}).")
    return check_function(
        _decode(kv_cache_step), _full_causal, _kv_cases(), what="kv_cache_step",
        output_names=("the outputs of steps 0..n-1", "the key cache's slots 0..n-1",
                      "the value cache's slots 0..n-1"),
        atol=1e-5, rtol=1e-4, forbid=_cache_helpers(),
        instead="Write slot t and call ah.scaled_dot_product_attention (notebook 02's) on slots 0..t",
        error_hints=[("expand", "k_t is (b, h, 1, d_k) and slot t of the cache, k_cache[:, :, t], is "
                                "(b, h, d_k): write k_t[:, :, 0] there (and v_t[:, :, 0]).")],
        guard=refusing_ops(["scaled_dot_product_attention", "_scaled_dot_product_*"],
                           "torch's fused attention does this step for you; call notebook 02's "
                           "ah.scaled_dot_product_attention on slots 0..t instead"),
        mistakes=[
            Mistake(_decode(_unwritten_step),
                    "slot t was never written: the new key and value were joined to slots 0..t-1, "
                    "but no step wrote those either, so every step after the first reads garbage "
                    "(the outputs are wrong, and so are the caches). A preallocated cache is "
                    "filled in place: k_cache[:, :, t] = k_t[:, :, 0] (and the value), then "
                    "attend to slots 0..t of the cache."),
            Mistake(_decode(_wrong_step(lambda t, n_max: (0, n_max))),
                    "the query attended to the whole preallocated cache, garbage slots included: "
                    "only slots 0..t are filled, so use k_cache[..., :t + 1, :]."),
            Mistake(_decode(_wrong_step(lambda t, n_max: (0, t))),
                    "off by one: slots 0..t-1 leave out the new token itself; a causal query also "
                    "sees its own position, so attend to slots 0..t (:t + 1)."),
            Mistake(_decode(_wrong_step(_right_visible, write_at=1)),
                    "off by one: with t positions already cached (slots 0..t-1), the new key and "
                    "value go into slot t, not t + 1."),
            Mistake(_decode(_wrong_step(lambda t, n_max: (t, t + 1))),
                    "the query attended to the new token only; it must see every earlier token "
                    "too: slots 0..t of the cache."),
            Mistake(_decode(_wrong_step(_right_visible, write_v=False)),
                    "the key was stored but not the value: write v_t into v_cache[..., t, :] too."),
            Mistake(_decode(_wrong_step(_right_visible, scale=1.0)),
                    "the scores are not scaled: divide by sqrt(d_k)."),
            Mistake(_decode(_wrong_step(_right_visible, dim=-2)),
                    "the softmax runs over the wrong axis (the single query): it must run over "
                    "the cached keys, the last axis."),
        ],
    )
