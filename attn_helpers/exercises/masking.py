"""Notebook 05's checkers: documents packed into one row (their mask and positions), a
sliding-window mask for a LEFT-padded batch, and a rolling-buffer KV cache."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from ..attention import scaled_dot_product_attention
from ..masks import padding_mask, sliding_window_mask
from .core import CheckResult, Mistake, Refused, check_function, seeded
from .workflow import exercise

__all__ = ["check_pack_documents", "check_rolling_cache_step", "check_window_mask"]

NOT_BROADCAST = "two tensors did not broadcast. "


def _as_float64(answer: Callable) -> Callable:
    """The learner's mask must be bool and the positions integer; both are compared as float64."""
    def wrapped(*args):
        out = answer(*args)
        outputs = tuple(out) if isinstance(out, tuple | list) else (out,)
        if not all(isinstance(x, torch.Tensor) for x in outputs):
            return out
        mask, *positions = outputs
        if positions and positions[0].dtype == torch.bool and mask.dtype != torch.bool:
            raise TypeError("the two outputs are in the wrong order: got a bool tensor of shape "
                            f"{tuple(positions[0].shape)} second. Return (mask, positions): the "
                            "(n, n) bool mask first, then the (n,) integer positions.")
        if mask.dtype != torch.bool:
            raise TypeError("the mask must be a bool tensor (True = may attend), got dtype "
                            f"{mask.dtype}")
        if positions and (positions[0].is_floating_point() or positions[0].dtype == torch.bool):
            raise TypeError("the positions index a table of position vectors: they must be an "
                            f"integer tensor, got dtype {positions[0].dtype}")
        return tuple(x.double() for x in outputs) if positions else mask.double()
    return wrapped if callable(answer) else answer


def _bools(verdict: CheckResult, axes: str) -> CheckResult:
    """The mask's wrong cell said as True/False, its index named by its ``axes``."""
    message = re.sub(r"the mask with wrong values: at index (\(.*?\)) you gave ([01]), expected "
                     r"([01]) \(largest difference 1\)", lambda m: "the mask with wrong values: at "
                     f"{axes} = {m[1]} you gave {m[2] == '1'}, expected {m[3] == '1'}", verdict.message)
    return CheckResult(verdict.passed, message)


def _pack(lengths: torch.Tensor, flaw: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Documents of ``lengths`` packed into one row: the ``(n, n)`` mask (key j in query i's
    document and j <= i) and the ``(n,)`` positions from 0 in each document, as float64.
    ``flaw``: one known mistake."""
    n = int(lengths.sum())
    i = torch.arange(n)
    ends = torch.cumsum(lengths, 0)                                      # one past each document
    doc = torch.searchsorted(ends, i, right=flaw != "boundary")          # (n,) document of token i
    starts = ends - lengths                                              # each document's first
    positions = {"not_restarted": i, "from_one": i - starts[doc] + 1, "minus_end": i - ends[doc],
                 "count_down": ends[doc] - 1 - i, "count_down_from_length": ends[doc] - i,
                 "modulo_first": i % lengths[0], "doc_index": doc,
                 "second_only": i - starts[doc.clamp(max=1)]}.get(flaw, i - starts[doc])
    same = doc[:, None] == doc[None, :]
    causal = i[None, :] <= i[:, None]
    mask = {"causal_only": causal, "strict": same & (i[None, :] < i[:, None]), "no_causal": same,
            "transposed": (same & causal).T, "inverted": ~(same & causal),
            "or": same | causal}.get(flaw, same & causal)
    return mask.double(), positions.double()


_PACK_MISTAKES = [   # (the flaw of _pack, its hint)
    ("causal_only", "the documents see each other: a token sees the earlier documents of the row. "
     "Packing is exact only if each token sees its own document alone: AND 'same document'."),
    ("no_causal", "each token sees the later tokens of its own document: the mask also needs the "
     "causal rule j <= i."),
    ("strict", "no token sees itself: you wrote j < i. Query i's own key is part of its past, so the "
     "causal rule is j <= i (the diagonal stays True)."),
    ("boundary", "each document's first token was put in the previous document: a boundary is off "
     "by one. Token i belongs to the first document whose end (one past its last token) exceeds i."),
    ("or", "the two rules were joined with OR (|): a token sees its whole document, and every "
     "earlier token of the row. A key must pass both: same document AND j <= i (&)."),
    ("transposed", "the mask is transposed: rows are queries i, columns keys j <= i."),
    ("inverted", "the mask is inverted: True means 'may attend'."),
    ("not_restarted", "the positions run on across the row: each document starts at position 0, "
     "as if it were alone."),
    ("from_one", "off by one: each document's positions start at 1; the first token sits at 0."),
    ("minus_end", "the positions are negative: you subtracted where each document ends, not where "
     "it starts."),
    ("count_down", "the positions count down to each document's end; they count up from 0 at its "
     "first token. Subtract where each document starts from the index, not the index from its end."),
    ("modulo_first", "the positions repeat every lengths[0] tokens: you took the index modulo the "
     "first document's length. Subtract each token's own document's start."),
    ("count_down_from_length", "the positions count down from each document's end; they count up "
     "from 0 at its first token. Subtract where each document starts from the index."),
    ("doc_index", "the positions are each token's document number. A position counts the tokens "
     "before it in its own document: 0, 1, 2, ... from each document's start."),
    ("second_only", "only the second document restarts at 0; the third and later ones run on. Every "
     "document counts from its own start: subtract starts[doc], each token's own document's start."),
]


@exercise("masking.pack_documents", "documents packed into one row: their mask and positions",
          hints=(
    "Pretraining packs whole documents into one row, with no padding. Each token must see only "
    "the earlier tokens of its own document, and count its position from its document's start.",
    "First find each token's document: document d covers the tokens from its start, the sum of "
    "the lengths before it, up to its end. Then two tokens may meet when they share a document "
    "AND the key is not after the query. A token's position is its index minus its document's "
    "start.",
    "n = int(lengths.sum())\n"
    "i = torch.arange(n)\n"
    "doc = ...                          # (n,): the document of each token\n"
    "starts = torch.cumsum(lengths, 0) - lengths   # (d,): each document's first token\n"
    "mask = ...                         # (n, n): same document AND j <= i\n"
    "positions = ...                    # (n,): 0 at each document's first token\n"
    "return mask, positions"))
def check_pack_documents(pack_documents: Callable) -> CheckResult:
    """``pack_documents(lengths (d,) int) -> (mask (n, n) bool, positions (n,) int)``."""
    cases = [{"lengths": torch.tensor(lengths)} for lengths in
             ([3, 5], [1, 4, 2], [6], [2, 1, 1, 3], [1], [4, 4, 1])]
    return _bools(check_function(
        _as_float64(pack_documents), _pack, cases, what="pack_documents",
        output_names=("the mask", "the positions"),
        mistakes=[Mistake(partial(_pack, flaw=flaw), hint) for flaw, hint in _PACK_MISTAKES],
        error_hints=[("must match the size of tensor", NOT_BROADCAST + "Each token's document is a "
                      "(n,) vector; comparing it with itself needs one copy as a column (n, 1) and "
                      "one as a row (1, n).")]), "(i, j)")


def _real(lengths: torch.Tensor, n: int, shift: int = 0) -> torch.Tensor:
    """``(b, n)``: True at sentence b's last ``lengths[b]`` positions (``shift``: off by one)."""
    return torch.arange(n)[None, :] >= n - lengths[:, None] + shift


def _window_mask(lengths: torch.Tensor, n: int, window: int) -> torch.Tensor:
    """``(b, n, n)``: key j real and ``0 <= i - j < window``."""
    return _real(lengths, n)[:, None, :] & sliding_window_mask(n, window)


_WINDOW_MISTAKES = [   # (what the mistake computes from lengths, n, window; its hint)
    (lambda L, n, w: padding_mask(L, n)[:, None, :] & sliding_window_mask(n, w),
     "the real tokens were taken at the start (right padding); a LEFT-padded sentence has its "
     "real tokens at the end: where does sentence b's first real token sit?"),
    (lambda L, n, w: (padding_mask(L, n)[:, None, :] & sliding_window_mask(n, w)).flip(-1),
     "you flipped a right-padded mask along the keys: that also mirrors the window. Flip only the "
     "(b, n) table of real tokens, then AND it with the causal window."),
    (lambda L, n, w: _real(L, n, 1)[:, None, :] & sliding_window_mask(n, w), "off by one: each "
     "sentence's first real token was treated as padding (its column is all False)."),
    (lambda L, n, w: _real(L, n, -1)[:, None, :] & sliding_window_mask(n, w), "off by one: each "
     "sentence's last pad was treated as a real token."),
    (lambda L, n, w: _window_mask(n - L, n, w), "your real keys start at index lengths[b], as if "
     "it counted the pads. It counts the real tokens: how many pads come first?"),
    (lambda L, n, w: _real(L, n)[:, None, :] & sliding_window_mask(n, w, causal=False), "your "
     "window looks both ways: query i also sees keys after it (j > i)."),
    (lambda L, n, w: _window_mask(L, n, w) | _real(L, n)[:, None, :].expand(-1, n, -1).triu(1),
     "your window has no lower bound: query i sees every later key (j > i). Keep 0 <= i - j too."),
    (lambda L, n, w: _real(L, n)[:, None, :] & sliding_window_mask(n, w).mT, "your window looks "
     "forward: query i sees keys i to i + w - 1. A causal window looks back: keys i - w + 1 to i."),
    (lambda L, n, w: _window_mask(L, n, w + 1), "off by one: each query sees w + 1 keys; it "
     "should see w: itself and the w - 1 before it."),
    (lambda L, n, w: _window_mask(L, n, w).mT, "each sentence's mask is transposed: rows are "
     "queries i, columns keys j <= i."),
    (lambda L, n, w: _real(L, n)[:, :, None] & sliding_window_mask(n, w), "the padding was "
     "applied to the queries (rows) instead of the keys (columns)."),
    (lambda L, n, w: _window_mask(L, n, n), "that is causal + padding with no window: also hide "
     "keys window or more positions back."),
    (lambda L, n, w: _window_mask(L[:1].expand(len(L)), n, w), "every sentence got the first "
     "sentence's length: real[b, j] depends on lengths[b]."),
    (lambda L, n, w: _window_mask(L, n, w) | (torch.eye(n, dtype=torch.bool) & ~_real(L, n)[..., None]),
     "pad queries were allowed to see themselves. Leave a pad query's row all False: attention "
     "turns an empty row into zeros (section 4)."),
    (lambda L, n, w: ~_window_mask(L, n, w), "the mask is inverted: True means 'may attend'."),
]


@exercise("masking.window_mask", "a sliding-window mask for a left-padded batch", hints=(
    "Batched generation pads on the LEFT: sentence b's real tokens are its last lengths[b] "
    "positions. A key is visible when it is real AND inside query i's causal window; a pad "
    "query's row stays all False.",
    "Combine two conditions with AND: which positions of sentence b are real (b, j), and which "
    "offsets i - j lie inside the causal window (i, j)? Give the first the missing query axis "
    "so that they broadcast to (b, n, n).",
    "j = torch.arange(n)\n"
    "real = ...                         # (b, n): True at sentence b's last lengths[b] positions\n"
    "offset = j[:, None] - j[None, :]   # i - j, (n, n)\n"
    "return ...                         # (b, n, n): real[:, None, :] AND the causal window on offset"))
def check_window_mask(window_mask: Callable) -> CheckResult:
    """``window_mask(lengths (b,), n, window) -> (b, n, n) bool``, LEFT-padded sentences."""
    cases = [{"lengths": torch.tensor(lengths), "n": n, "window": w} for lengths, n, w in [
        ([5, 3, 1], 5, 2), ([4, 2], 4, 1), ([7, 4, 0], 7, 3), ([3], 3, 5), ([2, 6, 5], 6, 6),
        ([1], 1, 1)]]
    return _bools(check_function(
        _as_float64(window_mask), lambda lengths, n, w: _window_mask(lengths, n, w).double(), cases,
        what="window_mask", output_names=("the mask",),
        mistakes=[Mistake(wrong, hint) for wrong, hint in _WINDOW_MISTAKES],
        error_hints=[("must match the size of tensor", NOT_BROADCAST + "Real keys form a (b, n) "
                      "table: key positions (n,) against one bound per sentence (b,), which needs a "
                      "new last axis. Give that table a query axis for the (n, n) mask.")]),
        "(b, i, j)")


_WRONG = [   # (hint, the flaw of _ring_step that makes the mistake)
    ("the query attended to all w slots before the ring was full; the unwritten ones hold garbage.",
     {"visible": lambda t, w: range(w)}),
    ("the ring never changed once full: a slice at slot t >= w is empty, so the write was lost. "
     "Token t goes to token t - w's slot.", {"lost_past_end": True}),
    ("off by one: the query attended before the new key was written, so token t missed "
     "itself: write first, then attend.", {"early": "missing"}),
    ("off by one: until the ring was full, the query did not see the key just written: after "
     "the write, how many slots hold keys at step t?", {"visible": lambda t, w: range(min(t, w))}),
    ("off by one: the query saw w + 1 keys, the ring's old contents and the new key: "
     "overwrite token t - w's slot first, then attend.", {"early": "extra"}),
    ("off by one: once the ring was full, the query skipped the oldest slot and saw w - 1 keys; "
     "a full ring holds exactly the window's w keys.",
     {"visible": lambda t, w: [s for s in range(min(t + 1, w)) if t < w - 1 or s != (t + 1) % w]}),
    ("after the ring wrapped, the query saw only the slots up to the newest one; once the ring "
     "is full, every slot holds a key of the window.", {"visible": lambda t, w: range(t % w + 1)}),
    ("the new key and value went one slot too far: token t takes token t - w's slot.",
     {"slot": lambda t, w: (t + 1) % w}),
    ("the new key and value went one slot back: token 0 went to the last slot, and the query read "
     "garbage in slot 0. Token t takes token t - w's slot.", {"slot": lambda t, w: (t - 1) % w}),
    ("the ring used only w - 1 of its w slots (slot t % (w - 1)): the window lost a key. Token t "
     "takes the slot of token t - w, the key leaving the window.", {"slot": lambda t, w: t % (w - 1)}),
    ("once the ring was full, you overwrote the newest key, not the one leaving the window: "
     "token t takes token t - w's slot.", {"slot": lambda t, w: min(t, w - 1)}),
    ("the key was written but not the value: v_t goes into the same slot of v_cache.",
     {"write_v": False}),
    ("the value cache got the key: write v_t, not k_t, into v_cache.", {"k_as_v": True}),
    ("the scores are not scaled: divide by sqrt(d_k) (ah.scaled_dot_product_attention does).",
     {"scale": 1.0}),
    ("is_causal=True hid every slot but the first: torch anchors its causal mask top-left "
     "(Going deeper). The ring holds no future key: attend to every filled slot, no mask.",
     {"top_left": True}),
]


def _ring_step(*, slot: Callable = lambda t, w: t % w, visible: Callable | None = None,
               early: str | None = None, lost_past_end: bool = False, write_v: bool = True,
               k_as_v: bool = False, scale: float | None = None, top_left: bool = False) -> Callable:
    """A rolling-cache step with one known mistake (all off: right): writes slot ``slot(t, w)``,
    attends to ``visible(t, w)``; ``early``: attends before writing, without/with the new key."""

    def step(k_cache, v_cache, t, q_t, k_t, v_t):
        w = k_cache.shape[-2]
        old = list(range(min(t, w)))
        keys = torch.cat([k_cache[..., old, :], k_t], dim=-2)       # before writing: the old
        values = torch.cat([v_cache[..., old, :], v_t], dim=-2)     # filled slots and the new
        if not (lost_past_end and t >= w):
            k_cache[..., slot(t, w), :] = k_t[..., 0, :]
            if write_v:
                v_cache[..., slot(t, w), :] = (k_t if k_as_v else v_t)[..., 0, :]
        if early == "missing":
            keys, values = keys[..., :-1, :], values[..., :-1, :]
        elif early is None:
            slots = list(visible(t, w) if visible is not None else range(min(t + 1, w)))
            keys, values = k_cache[..., slots, :], v_cache[..., slots, :]
            if top_left:
                return F.scaled_dot_product_attention(q_t, keys, values, is_causal=True)
        if keys.shape[-2] == 0:
            return torch.zeros_like(v_t)
        c = 1 / math.sqrt(q_t.shape[-1]) if scale is None else scale
        return torch.softmax(q_t @ keys.transpose(-2, -1) * c, dim=-1) @ values

    return step


def _ring_cases() -> list[dict]:
    """q, k, v of a sequence and two caches of ``w`` slots of garbage: n > 2w, w = 1, w >= n, and
    a random shape."""
    g = seeded(52)
    rb, rh, rk, rv = (int(i) for i in torch.randint(1, 5, (4,), generator=g))
    rw = int(torch.randint(2, 5, (1,), generator=g))
    f32, f64 = torch.float32, torch.float64
    shapes = [(1, 1, 8, 3, 4, 4, f64), (2, 3, 11, 4, 4, 3, f32), (2, 2, 5, 1, 3, 2, f64),
              (1, 2, 4, 6, 4, 5, f32), (rb, rh, 2 * rw + 3, rw, rk, rv, f32)]

    def randn(*size, dtype, scale=1.0):
        return scale * torch.randn(*size, generator=g, dtype=dtype)

    return [{"q": randn(b, h, n, d_k, dtype=dt), "k": randn(b, h, n, d_k, dtype=dt),
             "v": randn(b, h, n, d_v, dtype=dt), "k_cache": randn(b, h, w, d_k, dtype=dt, scale=100.0),
             "v_cache": randn(b, h, w, d_v, dtype=dt, scale=100.0)}
            for b, h, n, w, d_k, d_v, dt in shapes]


def _run_steps(step: Callable) -> Callable:
    """The outputs of ``step`` for t = 0..n-1, on copies of the caches."""

    def run(q, k, v, k_cache, v_cache):
        k_cache, v_cache = k_cache.clone(), v_cache.clone()
        n, w = q.shape[-2], k_cache.shape[-2]
        outputs = []
        for t in range(n):
            new, at = slice(t, t + 1), f"at step t={t} (w={w} slots)"
            before = k_cache.clone(), v_cache.clone()
            try:
                out = step(k_cache, v_cache, t, q[..., new, :], k[..., new, :], v[..., new, :])
            except NotImplementedError:                   # the stub
                raise
            except (IndexError, ValueError, RuntimeError) as exc:
                raise type(exc)(f"{at}: {exc}") from exc
            if out is None:
                return None
            moved = max(int((cache != copy).flatten(end_dim=-3).any(0).any(-1).sum())
                        for cache, copy in zip((k_cache, v_cache), before, strict=True))
            if moved == 0 and t < w:                      # the ring is not full: a slot must change
                raise Refused(f"{at} neither cache changed.\nHint: the caches were written on a "
                              "copy (clone, torch.cat, or a new name for a shifted cache), so the "
                              "caller's caches never change: write into k_cache and v_cache in place.")
            if moved > 1:
                raise Refused(f"{at} {moved} slots of a cache changed. A rolling buffer writes one "
                              "slot per step, where the key that just left the window was; shifting "
                              "the whole cache moves all w keys every step.")
            if not isinstance(out, torch.Tensor) or out.shape != v[..., new, :].shape:
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise Refused(f"{at} rolling_cache_step returned {got}. A step returns token t's "
                              f"output only: (b, h, 1, d_v) = {tuple(v[..., new, :].shape)}.")
            outputs.append(out)
        return torch.cat(outputs, dim=-2)

    return run


@exercise("masking.rolling_cache_step", "a rolling-buffer KV cache for a sliding window", hints=(
    "The cache has w slots and the window holds w keys. When token t arrives, which key leaves "
    "the window, and in which slot was it stored? Before the ring is full, which slots hold keys?",
    "Token t - w leaves as token t enters: number the slots so that a token's slot follows from "
    "its position alone. Until the ring is full, how many slots hold keys? The keys need not be "
    "in time order: attention's weighted sum is the same in any order.",
    "w = k_cache.shape[-2]                     # the ring's slots, one per key of the window\n"
    "s = ...                                   # token t's slot\n"
    "k_cache[:, :, s] = k_t[:, :, 0]           # in place, (b, h, d_k)\n"
    "v_cache[:, :, s] = v_t[:, :, 0]           # (b, h, d_v)\n"
    "filled = ...                              # how many slots hold keys\n"
    "out, _ = ah.scaled_dot_product_attention(q_t, k_cache[:, :, :filled], v_cache[:, :, :filled])\n"
    "return out                                # (b, h, 1, d_v)"))
def check_rolling_cache_step(rolling_cache_step: Callable) -> CheckResult:
    """``rolling_cache_step(k_cache (b, h, w, d_k), v_cache (b, h, w, d_v), t, q_t, k_t, v_t) ->
    (b, h, 1, d_v)``; over t = 0..n-1 it must equal sliding-window causal attention."""
    return check_function(
        _run_steps(rolling_cache_step) if callable(rolling_cache_step) else rolling_cache_step,
        lambda q, k, v, k_cache, v_cache: scaled_dot_product_attention(
            q, k, v, sliding_window_mask(q.shape[-2], k_cache.shape[-2]))[0],
        _ring_cases(), what="rolling_cache_step", output_names=("the outputs of steps 0..n-1",),
        atol=1e-5, rtol=1e-4, mistakes=[Mistake(_run_steps(_ring_step(**flaw)), hint)
                                        for hint, flaw in _WRONG],
        nan_hint="unwritten slots must not enter the softmax. They hold garbage: a garbage score "
                 "far above the real ones takes the max, the real weights round to 0, and zeroing "
                 "then renormalising gives 0 / 0 (section 2). Attend only to the filled slots, or "
                 "mask the others before the softmax.",
        error_hints=[("out of bounds for dimension",
                      "the cache has w slots, so token t cannot go to slot t once t >= w. It goes "
                      "where the key that just left the window was stored: token t - w's slot."),
                     ("must hold at least one key",
                      "off by one: at step t = 0 the query had no key, so token t missed itself. "
                      "Either it attended before the write (write first), or the count of filled "
                      "slots left the newest key out."),
                     ("expand", "k_t is (b, h, 1, d_k) and one slot of the cache, k_cache[:, :, s], "
                                "is (b, h, d_k): write k_t[:, :, 0] there (and v_t[:, :, 0]).")])
