"""Checkers for notebook 05 (masking): a batched causal sliding-window mask for LEFT-padded
sentences (the library's mask builders blocked while it runs), and one step of a rolling-buffer
KV cache (Mistral 7B's "rolling buffer cache": w slots for a window of w keys), which over a whole
sequence must equal sliding-window causal attention."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import CheckResult, Mistake, check_function, refusing_ops
from .masking_ring import (  # noqa: F401  (_ring_step: the tests import it from here)
    _NO_KEY,
    _SLOT_T,
    _WRONG,
    _mistake,
    _ring_cases,
    _ring_step,
    _run_steps,
    _sliding_window,
)
from .workflow import exercise

__all__ = ["check_window_mask", "check_rolling_cache_step"]

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
                            one_length: bool = False, transpose: bool = False,
                            drop_first: bool = False) -> torch.Tensor:
    """The answer of exercise 1, ``(b, n, n)`` bool: sentence ``b`` has its ``lengths[b]`` real
    tokens at the END (positions ``n - lengths[b] .. n - 1``); query ``i`` may attend to key ``j``
    when ``j`` is a real token and ``0 <= i - j < window``. The keyword arguments build the known
    mistakes (all off: the right answer)."""
    if one_length:
        lengths = lengths[:1].expand(len(lengths))
    positions = torch.arange(n)
    start = n - lengths[:, None] + int(drop_first) if left else None    # (b, 1): first real slot
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
                            "a LEFT-padded sentence has its real tokens at the end. With n "
                            "positions and lengths[b] real tokens, at which position does "
                            "sentence b's first real token sit?", left=False),
            _window_mistake("off by one: each sentence's first real token was treated as padding "
                            "(its column is all False), so every sentence lost one real token. "
                            "Sentence b's lengths[b] real tokens fill the last lengths[b] "
                            "positions: does your comparison keep the first of them?",
                            drop_first=True),
            _window_mistake("your window looks both ways: query i also sees keys after it (j > i). "
                            "A causal window sees only the present and the past: which sign of "
                            "i - j must it refuse?", both_ways=True),
            _window_mistake("off by one: each query sees w + 1 keys. With window w a query sees "
                            "itself and the w - 1 keys before it: which offsets i - j is that, "
                            "and which one does your condition let through?", reach=1),
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


# --- exercise 2: a rolling-buffer KV cache for a sliding window -------------------------------


def _cache_helpers():
    """The course's cache is blocked (it would do the bookkeeping), and so is torch's fused
    attention, as in notebooks 02, 04 and 08. The course's own attention
    (``ah.scaled_dot_product_attention``, notebook 02's exercise) is allowed: the skill is the
    ring."""
    import importlib

    from .. import kv_cache

    return [(kv_cache.KVCache, "append"), (kv_cache.KVCache, "attend"),
            (kv_cache, "decode_with_cache"),
            (importlib.import_module("attn_helpers"), "decode_with_cache"),
            (torch.nn.functional, "scaled_dot_product_attention")]


@exercise("masking.rolling_cache_step", "a rolling-buffer KV cache for a sliding window", hints=(
    "The cache has w slots and the window holds w keys. When token t arrives, which key leaves "
    "the window, and in which slot was it stored? And before the ring is full: which slots "
    "hold a key at all?",
    "Token t - w leaves the window as token t enters: number the slots so that a token's slot "
    "follows from its position alone, and token t can take the slot token t - w held. Until "
    "the ring is full, how many slots hold keys? The ring does not keep the "
    "keys in time order, and it need not: attention's weighted sum is the same in any order of "
    "the keys (their positions are already inside them). The attention itself is notebook 02's.",
    "w = k_cache.shape[-2]                     # the ring's slots, one per key of the window\n"
    "s = ...                                   # token t's slot\n"
    "k_cache[:, :, s] = k_t[:, :, 0]           # in place, (b, h, d_k)\n"
    "v_cache[:, :, s] = v_t[:, :, 0]           # (b, h, d_v)\n"
    "filled = ...                              # how many slots hold keys\n"
    "out, _ = ah.scaled_dot_product_attention(q_t, k_cache[:, :, :filled], v_cache[:, :, :filled])\n"
    "return out                                # (b, h, 1, d_v)"))
def check_rolling_cache_step(rolling_cache_step: Callable) -> CheckResult:
    """Exercise: ``rolling_cache_step(k_cache (b, h, w, d_k), v_cache (b, h, w, d_v), t,
    q_t (b, h, 1, d_k), k_t (b, h, 1, d_k), v_t (b, h, 1, d_v)) -> (b, h, 1, d_v)``: writes token
    ``t``'s key and value into the ring of ``w`` slots, in place, over the key that left the
    window (one slot per step; the reference uses slot ``t mod w``, any such rule passes), and
    attends with ``q_t`` to the filled slots. Run for ``t = 0..n-1`` it must equal sliding-window
    causal attention (``0 <= t - j < w``), and the caches must end holding the window's last
    ``min(n, w)`` keys and values, each once. It may call the course's
    ``ah.scaled_dot_product_attention``; the course's cache and torch's fused attention are
    blocked."""
    if not callable(rolling_cache_step):
        return CheckResult(False, "Not yet: rolling_cache_step is not a function "
                                  f"(got {type(rolling_cache_step).__name__}).")
    return check_function(
        _run_steps(rolling_cache_step), _sliding_window, _ring_cases(), what="rolling_cache_step",
        output_names=("the outputs of steps 0..n-1", "the key cache's filled slots",
                      "the value cache's filled slots"),
        atol=1e-5, rtol=1e-4, forbid=_cache_helpers(),
        instead="Write the ring's slot and call notebook 02's ah.scaled_dot_product_attention "
                "on the slots that hold keys",
        error_hints=[("out of bounds for dimension", _SLOT_T),
                     ("must hold at least one key", _NO_KEY),
                     ("expand", "k_t is (b, h, 1, d_k) and one slot of the cache, k_cache[:, :, s], "
                                "is (b, h, d_k): write k_t[:, :, 0] there (and v_t[:, :, 0]).")],
        guard=refusing_ops(["scaled_dot_product_attention", "_scaled_dot_product_*"],
                           "torch's fused attention does this step for you; call notebook 02's "
                           "ah.scaled_dot_product_attention on the filled slots instead"),
        mistakes=[_mistake(hint, **flaw) for hint, flaw in _WRONG],
    )
